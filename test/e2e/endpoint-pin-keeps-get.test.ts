// A session the store lost, on two store-less SDK servers that keep an event
// store (their standalone events carry ids, and a GET resumes from one). The
// record a recovery writes names no endpoint; once the endpoint holding the
// session is known (it answered one of its requests, or a request met 404
// elsewhere and each endpoint was asked), the record names it: the same
// upstream session, only its endpoint named. That is no move to a new upstream
// session: the gateway's GET open there goes on, and the upstream's last event
// id is kept, so a GET opened again later resumes the upstream's stream with
// its Last-Event-ID (STANDALONE_REOPEN_FROM_LAST_ID=true), and nothing the
// upstream sent meanwhile is lost. The gateway restarts on its embedded store;
// on Redis the keys are deleted and a new gateway serves the session. Each new
// gateway lists the endpoint holding the session first: round robin sends the
// recovered session's first request without an endpoint (its upstream GET)
// there, and the next one to the other endpoint.
import t, { type Test } from 'tap'
import { setTimeout as sleep } from 'node:timers/promises'
import { request } from 'undici'
import { startGateway, startGatewayOnRedis, type RunningGateway } from '../fixtures/gateway.js'
import { ACCEPT_BOTH, exchange, metricSum, metrics, rawInitialize, sseEvents, until, type RawSession, type SseEvent } from '../fixtures/hardening.js'
import { deleteKeys, useRedis } from '../fixtures/redis.js'
import { startRestartableUpstream, type RestartableUpstream } from '../fixtures/restartable-upstream.js'

const VERSION = '2025-06-18'
/** Notifications on the standalone stream, sent by the upstream from before the store's loss to after the endpoint is found. */
const BROADCAST = { count: 150, intervalMs: 20 }

interface Recovered {
  /** The gateway that never saw the session (its store lost it). */
  readonly gw: RunningGateway
  readonly session: RawSession
  readonly holder: RestartableUpstream
  readonly upstreamId: string
  /** The holder's requests before that gateway started. */
  readonly seenBefore: number
  /** When the broadcast, if any, sends its last notification. */
  readonly broadcastEnds: number
}

/**
 * A session initialized through a first gateway (and, with `broadcast`, its
 * upstream started sending BROADCAST on its standalone stream), then lost
 * with that gateway's store: served by a second gateway from here on.
 */
async function recovered (t: Test, kind: 'memory' | 'redis', options: { broadcast: boolean, env?: Record<string, string> }): Promise<Recovered> {
  const upstreams = [await startRestartableUpstream({ eventStore: true }), await startRestartableUpstream({ eventStore: true })]
  for (const u of upstreams) t.teardown(() => u.close())
  const redis = kind === 'redis' ? await useRedis(t, 'pin-keeps-get') : undefined
  const env = options.env ?? {}
  const start = async (urls: readonly RestartableUpstream[]): Promise<RunningGateway> => {
    const upstreamUrl = urls.map(u => u.url).join(',')
    return redis === undefined ? await startGateway(t, 'memory', upstreamUrl, env) : await startGatewayOnRedis(t, redis, upstreamUrl, env)
  }
  const first = await start(upstreams)
  const session = await rawInitialize(`${first.url}/mcp`, { version: VERSION, headers: { accept: ACCEPT_BOTH } })
  const holder = upstreams.find(u => u.life.initialized.some(id => session.sessionId.endsWith(`.${id}`))) as RestartableUpstream
  const other = upstreams.find(u => u !== holder) as RestartableUpstream
  const upstreamId = holder.life.initialized.find(id => session.sessionId.endsWith(`.${id}`)) as string
  let broadcastEnds = Date.now()
  if (options.broadcast) {
    const started = await call(first, session, 'broadcast_standalone', BROADCAST)
    if (started.status !== 200) throw new Error(`broadcast_standalone: HTTP ${started.status}`)
    broadcastEnds = Date.now() + BROADCAST.count * BROADCAST.intervalMs
  }
  await first.close()
  if (redis !== undefined && await deleteKeys(redis.redis, redis.prefix) === 0) throw new Error('no key deleted')
  const seenBefore = holder.life.requests.length
  const gw = await start([holder, other])
  return { gw, session, holder, upstreamId, seenBefore, broadcastEnds }
}

let calls = 100
async function call (gw: RunningGateway, session: RawSession, name: string, args: Record<string, unknown>): Promise<{ status: number | undefined, events: SseEvent[] }> {
  const body = JSON.stringify({ jsonrpc: '2.0', id: calls++, method: 'tools/call', params: { name, arguments: args } })
  const answer = await exchange(`${gw.url}/mcp`, { method: 'POST', headers: session.headers(), body })
  return { status: answer.status, events: sseEvents(answer.text) }
}

/** The gateway's GETs of the upstream session on its holder since the second gateway started. */
function upstreamGets (r: Recovered): Array<{ lastEventId?: string }> {
  return r.holder.life.requests.slice(r.seenBefore).filter(q => q.method === 'GET' && q.sessionId === r.upstreamId)
}

/** A client's GET, read as it comes. */
interface ClientStream {
  readonly status: Promise<number>
  events: () => SseEvent[]
  close: () => void
}

function clientGet (url: string, headers: Record<string, string>): ClientStream {
  const abort = new AbortController()
  let text = ''
  const status = request(url, { headers, signal: abort.signal }).then(res => {
    const decoder = new TextDecoder()
    res.body.on('data', (chunk: Buffer) => { text += decoder.decode(chunk, { stream: true }) })
    res.body.on('error', () => {})
    return res.statusCode
  })
  return { status, events: () => sseEvents(text), close: () => { abort.abort() } }
}

/** The broadcast's sequence numbers among `events`, in order. */
function broadcastSeqs (events: readonly SseEvent[]): number[] {
  const seqs: number[] = []
  for (const e of events) {
    const message = parse(e.data) as { method?: string, params?: { logger?: string, data?: unknown } } | undefined
    if (message?.method === 'notifications/message' && message.params?.logger === 'broadcast') seqs.push(message.params.data as number)
  }
  return seqs
}

/** Texts of notify_standalone among `events`. */
function standaloneTexts (events: readonly SseEvent[]): unknown[] {
  return events.map(e => parse(e.data) as { params?: { logger?: string, data?: unknown } } | undefined)
    .filter(m => m?.params?.logger === 'standalone').map(m => m?.params?.data)
}

function parse (data: string): unknown {
  try {
    return JSON.parse(data)
  } catch {
    return undefined
  }
}

function from (first: number, end: number): number[] {
  return Array.from({ length: end - first }, (_, i) => first + i)
}

async function standaloneOpen (gw: RunningGateway): Promise<number> {
  return metricSum(await metrics(gw.adminUrl), 'mcpgw_upstream_streams_open', { kind: 'standalone' })
}

for (const kind of ['memory', 'redis'] as const) {
  t.test(`${kind} store: the endpoint found after a 404 elsewhere keeps the upstream GET open on it`, async t => {
    const r = await recovered(t, kind, { broadcast: true })
    const { gw, session, holder } = r
    const stream = clientGet(`${gw.url}/mcp`, session.getHeaders())
    t.teardown(() => { stream.close() })
    t.equal(await stream.status, 200, 'the client\'s GET opens')
    t.ok(await until(() => broadcastSeqs(stream.events()).length >= 3, 5000), 'the upstream\'s notifications reach it')
    t.equal((await gw.store.getSession(session.sessionId))?.endpoint, undefined, 'the recovered record names no endpoint')
    t.equal(upstreamGets(r).length, 1, 'the gateway\'s GET went to the endpoint holding the session')

    // Round robin: to the other endpoint, which answers 404; each endpoint is asked, the holder found.
    const answer = await call(gw, session, 'echo', { text: 'found' })
    t.equal(answer.status, 200, 'the call is answered')
    t.ok(answer.events.some(e => e.data.includes('"found"')), 'with the tool\'s result')
    const record = await gw.store.getSession(session.sessionId)
    t.equal(record?.endpoint, new URL(holder.url).origin, 'the record names the endpoint holding the session')
    t.equal(record?.upstreamSessionId, r.upstreamId, 'the same upstream session')
    t.equal(metricSum(await metrics(gw.adminUrl), 'mcpgw_upstream_sessions_reestablished_total', { outcome: 'found' }), 1, 'found after the 404')

    t.ok(await until(() => broadcastSeqs(stream.events()).at(-1) === BROADCAST.count - 1, r.broadcastEnds - Date.now() + 5000), 'the last notification arrives')
    t.equal(upstreamGets(r).length, 1, 'the GET open on that endpoint went on: not opened again')
    const seqs = broadcastSeqs(stream.events())
    t.same(seqs, from(seqs[0] as number, BROADCAST.count), 'every notification from the first the client got on arrives, none lost')
    t.equal(await standaloneOpen(gw), 1, 'one upstream GET open')
  })

  t.test(`${kind} store, STANDALONE_REOPEN_FROM_LAST_ID=true: a GET opened again once the endpoint is found resumes the upstream's stream from its last event id`, async t => {
    // The upstream's store resumes the standalone stream (SessionEvents), so resuming is turned on.
    const r = await recovered(t, kind, { broadcast: true, env: { STANDALONE_HOLD_SECONDS: '1', STANDALONE_REOPEN_FROM_LAST_ID: 'true' } })
    const { gw, session, holder } = r
    const stream = clientGet(`${gw.url}/mcp`, session.getHeaders())
    t.equal(await stream.status, 200, 'the client\'s GET opens')
    t.ok(await until(() => broadcastSeqs(stream.events()).length >= 3, 5000), 'the upstream\'s notifications reach it')
    t.equal(upstreamGets(r).length, 1, 'the gateway\'s GET went to the endpoint holding the session')
    stream.close()
    const seen = stream.events()
    const lastSeen = broadcastSeqs(seen).at(-1) as number
    t.ok(await until(async () => await standaloneOpen(gw) === 0, 5000), 'no client for the hold: the upstream GET is let go')

    const answer = await call(gw, session, 'echo', { text: 'found' })
    t.equal(answer.status, 200, 'a call meets 404 elsewhere and is answered where the session lives')
    t.equal((await gw.store.getSession(session.sessionId))?.endpoint, new URL(holder.url).origin, 'the record names the endpoint holding the session')
    t.ok(await until(() => upstreamGets(r).length === 2, 5000), 'the session\'s GET is opened again there')
    t.not(upstreamGets(r)[1]?.lastEventId, undefined, 'with the upstream\'s last event id (Last-Event-ID): the same upstream session\'s stream')

    await sleep(Math.max(0, r.broadcastEnds - Date.now()) + 200)
    const lastId = seen.filter(e => e.id !== undefined).at(-1)?.id as string
    const resumed = await exchange(`${gw.url}/mcp`, { headers: session.getHeaders(lastId) }, 1500)
    t.equal(resumed.status, 200, 'the client resumes')
    const events = sseEvents(resumed.text)
    t.same(broadcastSeqs(events), from(lastSeen + 1, BROADCAST.count), 'and gets every notification sent since, also while no GET was open')
    t.equal(events.filter(e => e.event === 'gateway-gap').length, 0, 'no gap')
    t.equal(metricSum(await metrics(gw.adminUrl), 'mcpgw_gaps_total'), 0, 'none recorded')
  })

  t.test(`${kind} store: the endpoint named after it answered a request; the GET the upstream ends is resumed from its last event id`, async t => {
    const r = await recovered(t, kind, { broadcast: false })
    const { gw, session, holder } = r
    const stream = clientGet(`${gw.url}/mcp`, session.getHeaders())
    t.teardown(() => { stream.close() })
    t.equal(await stream.status, 200, 'the client\'s GET opens')
    t.ok(await until(() => upstreamGets(r).length === 1, 5000), 'the gateway\'s GET went to the endpoint holding the session')
    // A request without a session: round robin to the other endpoint, so the next goes to the holder.
    await exchange(`${gw.url}/elsewhere`)
    const before = await call(gw, session, 'notify_standalone', { text: 'before' })
    t.equal(before.status, 200, 'a call answered by the endpoint holding the session')
    t.equal((await gw.store.getSession(session.sessionId))?.endpoint, new URL(holder.url).origin, 'which the record names from then on')
    t.ok(await until(() => standaloneTexts(stream.events()).includes('before'), 5000), 'its notification reaches the client')

    t.equal((await call(gw, session, 'close_standalone', {})).status, 200, 'the upstream ends its GET stream')
    t.equal((await call(gw, session, 'notify_standalone', { text: 'between' })).status, 200, 'and sends on it, its GET maybe not open again yet')
    t.ok(await until(() => upstreamGets(r).length === 2, 5000), 'the gateway resumes the GET')
    t.not(upstreamGets(r)[1]?.lastEventId, undefined, 'from the upstream\'s last event id: the record naming the endpoint is no new upstream session')
    t.ok(await until(() => standaloneTexts(stream.events()).includes('between'), 5000), 'what the upstream sent in between reaches the client')
    t.equal(metricSum(await metrics(gw.adminUrl), 'mcpgw_gaps_total'), 0, 'no gap')
  })
}
