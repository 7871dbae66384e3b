import { existsSync, readFileSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'

/** The nearest package.json above this module (src/ when run from source, dist/src/ when built). */
function readVersion (): string {
  let dir = dirname(fileURLToPath(import.meta.url))
  for (let i = 0; i < 4; i++) {
    const candidate = join(dir, 'package.json')
    if (existsSync(candidate)) return (JSON.parse(readFileSync(candidate, 'utf8')) as { version: string }).version
    dir = dirname(dir)
  }
  return '0.0.0'
}

/** The package version, for build_info and logs. */
export const VERSION: string = readVersion()
