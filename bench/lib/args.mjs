// Command-line options of the bench scripts: --name=value, or --flag (true).

export function parseArgs (argv = process.argv.slice(2)) {
  const out = {}
  for (const a of argv) {
    const m = /^--([^=]+)(?:=(.*))?$/.exec(a)
    if (m === null) throw new Error(`unknown argument ${a}`)
    out[m[1]] = m[2] ?? true
  }
  return out
}
