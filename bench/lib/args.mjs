// Command-line options of the bench scripts: --name=value, or --flag (true).
// Each script names the options it knows: anything else is refused, so a typo
// never starts a ten-minute run that overwrites the committed results.
// --help prints the script's header comment (its usage) and exits.
import { readFileSync } from 'node:fs'
import { fileURLToPath } from 'node:url'

/** The leading comment block of a script, without the comment markers. */
export function usageOf (scriptUrl) {
  const lines = readFileSync(fileURLToPath(scriptUrl), 'utf8').split('\n')
  const out = []
  for (const line of lines) {
    if (line.startsWith('#!')) continue
    if (!line.startsWith('//')) break
    out.push(line.replace(/^\/\/ ?/, ''))
  }
  return out.join('\n')
}

/** Parses argv against the known option names; prints usage and exits on --help or a mistake. */
export function parseArgs (known, scriptUrl, argv = process.argv.slice(2)) {
  const out = {}
  const problems = []
  for (const a of argv) {
    const m = /^--([^=]+)(?:=(.*))?$/.exec(a)
    if (m?.[1] === 'help') {
      process.stdout.write(usageOf(scriptUrl) + '\n')
      process.exit(0)
    }
    if (m === null) problems.push(`unknown argument ${a}`)
    else if (!known.includes(m[1])) problems.push(`unknown option --${m[1]}`)
    else out[m[1]] = m[2] ?? true
  }
  if (problems.length > 0) {
    process.stderr.write(`${problems.join('\n')}\nknown options: ${known.map(k => `--${k}`).join(' ')} (--help for usage)\n`)
    process.exit(2)
  }
  return out
}
