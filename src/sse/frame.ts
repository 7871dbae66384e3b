/**
 * SSE framing of the gateway's outgoing events (WHATWG HTML, "Server-sent
 * events"). Upstream events go out as the bytes the upstream sent (see
 * sse/decoder.ts); these frame what the gateway says itself.
 */
import { createParser } from 'eventsource-parser'
import type { GapNotice } from '../gaps.js'
import { isField, keptLines } from './lines.js'

/** Event type of the gateway's own gap notices; MCP clients only act on "message". */
export const GAP_EVENT = 'gateway-gap'

export function formatEvent (id: string, data: string, event?: string): string {
  return `id: ${id}\n` + formatEventWithoutId(data, event)
}

/** An event without an id line: the client's resume position does not move. */
export function formatEventWithoutId (data: string, event?: string): string {
  let frame = ''
  if (event !== undefined && event !== '' && event !== 'message') frame += `event: ${event}\n`
  // A data value never holds CR: the parser normalised line endings to \n.
  if (data.indexOf('\n') === -1) {
    frame += `data: ${data}\n\n`
  } else {
    for (const line of data.split('\n')) frame += `data: ${line}\n`
    frame += '\n'
  }
  return frame
}

/** The priming event of 2025-11-25: an id to resume from, empty data, a retry hint. */
export function formatPriming (id: string, retryMs: number): string {
  return `id: ${id}\nretry: ${retryMs}\ndata: \n\n`
}

export function formatRetry (retryMs: number): string {
  return `retry: ${retryMs}\n\n`
}

export function formatComment (text: string): string {
  return `: ${text.replace(/[\r\n]+/g, ' ')}\n\n`
}

/**
 * A gap notice. It carries data (so no client mistakes it for priming) but a
 * type other than "message", so MCP clients skip it; no id, so it does not move
 * the client's resume position.
 */
export function formatGap (notice: GapNotice): string {
  return `event: ${GAP_EVENT}\ndata: ${JSON.stringify(notice)}\n\n`
}

const AFTER_LF = Buffer.from('\n')
const AFTER_CR = Buffer.from('\n\n')

/**
 * An upstream frame as a complete event without a gateway id (degraded mode).
 * The blank line after it: a frame whose last line ends in a lone CR needs
 * two LFs, since one would only make that CR a CRLF.
 */
export function frameWithoutId (frame: Buffer): Buffer {
  return Buffer.concat([frame, frame[frame.length - 1] === 0x0d ? AFTER_CR : AFTER_LF])
}

/**
 * What a client makes of a frame: its data and event type, by the same parser
 * clients use. Off the hot path (tests, the check whether a request stream's
 * event answers its request, the answers the gateway reads). Only the `data`
 * and `event` lines reach the parser: the others change neither, and the
 * parser makes an error object, with its stack, of every line it does not
 * know, which for an event of millions of such lines (within MAX_EVENT_BYTES)
 * would hold the process for seconds.
 */
export function parseFrame (frame: Buffer): { data: string, event: string | undefined } | undefined {
  let parsed: { data: string, event: string | undefined } | undefined
  const parser = createParser({ onEvent: e => { parsed ??= { data: e.data, event: e.event } } })
  // A frame never starts a stream: a byte order mark in it is data, as for a client.
  parser.feed(new TextDecoder('utf-8', { ignoreBOM: true }).decode(keptLines(frame, 0, frame.length, isDataOrEvent)))
  parser.feed('\n\n')
  return parsed
}

function isDataOrEvent (buf: Buffer, start: number, end: number): boolean {
  return isField(buf, start, end, 'data') || isField(buf, start, end, 'event')
}

/** Does `bytes` hold a UTF-8 byte order mark at `at`? */
export function startsWithBom (bytes: Uint8Array, at: number): boolean {
  return bytes[at] === 0xef && bytes[at + 1] === 0xbb && bytes[at + 2] === 0xbf
}
