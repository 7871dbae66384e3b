/**
 * The start of an upstream answer read before it is passed on, when the
 * gateway must look at it first (an initialize's result, a 400 that may say
 * the session is unknown). Bounded: reading stops past `maxBytes`, or when
 * `enough` says so. The answer's bytes are never lost: `body` gives what was
 * read, then the rest; whoever drops it drops the upstream's body too.
 */
import { PassThrough, pipeline, type Readable } from 'node:stream'

export interface AnswerStart {
  /** What was read, in order. */
  readonly chunks: readonly Buffer[]
  /** The whole answer was read (it ended within the bound). */
  readonly ended: boolean
  /** The whole answer as the upstream sent it: the bytes read, then the rest. */
  readonly body: Readable
}

/** `maxWaitMs`: reading also stops after this long (undefined: as long as the upstream takes). */
export async function readAnswerStart (body: Readable, maxBytes: number, enough: (chunk: Buffer) => boolean = () => false, maxWaitMs?: number): Promise<AnswerStart> {
  const chunks: Buffer[] = []
  let bytes = 0
  let timer: NodeJS.Timeout | undefined
  const ended = await new Promise<boolean>((resolve, reject) => {
    const done = (end: boolean): void => {
      clearTimeout(timer)
      body.off('data', onData)
      body.off('end', onEnd)
      body.off('error', onError)
      if (!end) body.pause()
      resolve(end)
    }
    const onData = (chunk: Buffer): void => {
      chunks.push(chunk)
      bytes += chunk.length
      if (enough(chunk) || bytes > maxBytes) done(false)
    }
    const onEnd = (): void => done(true)
    const onError = (err: Error): void => {
      clearTimeout(timer)
      body.off('data', onData)
      body.off('end', onEnd)
      reject(err)
    }
    if (maxWaitMs !== undefined) timer = setTimeout(() => done(false), maxWaitMs)
    body.on('data', onData)
    body.on('end', onEnd)
    body.on('error', onError)
  })
  const rest = new PassThrough()
  for (const chunk of chunks) rest.write(chunk)
  if (ended) rest.end()
  else pipeline(body, rest, () => {})
  return { chunks, ended, body: rest }
}
