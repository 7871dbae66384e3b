/**
 * Field lines of upstream SSE bytes (WHATWG HTML, "Server-sent events"): a
 * line ends at CR, LF or CRLF, and names its field up to its first colon.
 * Pure, over byte ranges: nothing is decoded but what a caller asks for.
 */

export const LF = 0x0a
export const CR = 0x0d
const COLON = 0x3a

/** Does the line [start, end) of `buf` name the field `name` ("name" alone, or "name:...")? */
export function isField (buf: Uint8Array, start: number, end: number, name: string): boolean {
  const n = name.length
  if (end - start < n || (end - start > n && buf[start + n] !== COLON)) return false
  for (let i = 0; i < n; i++) if (buf[start + i] !== name.charCodeAt(i)) return false
  return true
}

/**
 * The lines of [start, end) that `keep` accepts (given each line without its
 * break), with their line breaks, in order. Consecutive kept lines are copied
 * as one run, so the cost grows with the bytes and the lines dropped, not with
 * every line kept: an event of millions of short lines costs one pass. A view
 * of `buf` when every line is kept, else a new buffer.
 */
export function keptLines (buf: Buffer, start: number, end: number, keep: (buf: Buffer, lineStart: number, lineEnd: number) => boolean): Buffer {
  const runs: Buffer[] = []
  let runStart = start
  let i = start
  while (i < end) {
    let j = i
    while (j < end && buf[j] !== LF && buf[j] !== CR) j++
    const next = Math.min(buf[j] === CR && j + 1 < end && buf[j + 1] === LF ? j + 2 : j + 1, end)
    if (!keep(buf, i, j)) {
      if (i > runStart) runs.push(buf.subarray(runStart, i))
      runStart = next
    }
    i = next
  }
  if (runStart === start) return buf.subarray(start, end)
  if (end > runStart) runs.push(buf.subarray(runStart, end))
  return Buffer.concat(runs)
}
