import neostandard from 'neostandard'

export default [
  ...neostandard({ ts: true, ignores: ['dist/**', 'node_modules/**', '.tap/**', 'bench/results/**'] }),
  {
    // Every bounded map goes through boundedLru: lru-cache's own `max` allocates
    // for the whole bound up front (see src/lru.ts).
    files: ['src/**/*.ts'],
    ignores: ['src/lru.ts'],
    rules: {
      'no-restricted-imports': ['error', {
        paths: [{ name: 'lru-cache', message: 'use boundedLru (src/lru.ts)' }],
        patterns: [{ group: ['lru-cache/*'], message: 'use boundedLru (src/lru.ts)' }]
      }]
    }
  }
]
