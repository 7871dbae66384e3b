// What `npm start` runs, read from a checkout's package.json: one reading of
// its words for the benchmark (each build started as its own npm start would
// start it) and the packaging tests (the image starts the gateway the same way).
import { readFileSync } from 'node:fs'

/**
 * `[NAME=value ...] node <flags> <main>`: the environment set before node,
 * node's flags and the script node runs.
 */
export function parseStartScript (script) {
  const words = script.trim().split(/\s+/)
  const node = words.indexOf('node')
  if (node < 0) throw new Error(`the start script does not run node: ${script}`)
  const env = Object.fromEntries(words.slice(0, node).map(w => {
    const eq = w.indexOf('=')
    if (eq <= 0) throw new Error(`the start script sets its environment as NAME=value before node, not ${w}`)
    return [w.slice(0, eq), w.slice(eq + 1)]
  }))
  const rest = words.slice(node + 1)
  const main = rest.findIndex(w => !w.startsWith('-'))
  if (main < 0) throw new Error(`the start script names no script for node: ${script}`)
  return { env, flags: rest.slice(0, main), main: rest[main] }
}

/** The start script of the package.json at `path`. */
export function readStartScript (path) {
  const script = JSON.parse(readFileSync(path, 'utf8')).scripts?.start
  if (typeof script !== 'string') throw new Error(`${path} has no start script`)
  return parseStartScript(script)
}
