// A session's standalone stream as this process sees it (src/sessions/local-session.ts):
// each allowed move of its state, and each one refused or ignored elsewhere.
import t from 'tap'
import { LocalSession, LocalSessions, type Opened, type StandaloneState } from '../../src/sessions/local-session.js'
import type { ClientStream } from '../../src/sse/client-stream.js'
import { STANDALONE_STREAM } from '../../src/store/contract.js'
import type { StandalonePump } from '../../src/sessions/standalone-pump.js'
import type { UpstreamResponse } from '../../src/upstream/client.js'

type Kind = StandaloneState['kind']
const KINDS: readonly Kind[] = ['idle', 'watching', 'opening', 'starting', 'pumping']

/** What LocalSession reads of a pump: whether it stopped. */
function fakePump (): StandalonePump & { stopped: boolean } {
  return { stopped: false } as unknown as StandalonePump & { stopped: boolean }
}

interface Reached {
  readonly s: LocalSession
  /** The pump of starting and pumping. */
  readonly pump: StandalonePump & { stopped: boolean }
  /** The opening of opening and starting, and how to settle it. */
  readonly opened: Opened | undefined
  readonly settle: (value: UpstreamResponse | null) => void
  /** How many times the watch of watching was stopped. */
  readonly unwatched: () => number
}

/** A session in state `kind`, reached through its allowed moves. */
async function reach (kind: Kind): Promise<Reached> {
  const s = new LocalSession()
  const pump = fakePump()
  let unwatched = 0
  let settle: (value: UpstreamResponse | null) => void = () => {}
  let opened: Opened | undefined
  if (kind === 'watching') s.watch(() => () => { unwatched++ })
  if (kind === 'opening' || kind === 'starting' || kind === 'pumping') {
    opened = s.open(async () => await new Promise<UpstreamResponse | null>(resolve => { settle = resolve }))
  }
  if (kind === 'starting' || kind === 'pumping') s.pumpStarted(pump)
  if (kind === 'pumping') {
    settle(null)
    await opened
    opened = undefined
  }
  if (s.kind !== kind) throw new Error(`reached ${s.kind}, not ${kind}`)
  return { s, pump, opened, settle, unwatched: () => unwatched }
}

const refusal = { statusCode: 405 } as unknown as UpstreamResponse

t.test('a new session is idle: nothing held, opened or watched', async t => {
  const s = new LocalSession()
  t.equal(s.kind, 'idle')
  t.notOk(s.pumping)
  t.equal(s.pump, undefined)
  t.equal(s.opening, undefined)
  t.notOk(s.watching)
  t.ok(s.unused)
})

t.test('idle → watching: the watch begins', async t => {
  const s = new LocalSession()
  let begun = 0
  t.ok(s.watch(() => { begun++; return () => {} }))
  t.equal(begun, 1)
  t.equal(s.kind, 'watching')
  t.ok(s.watching)
  t.notOk(s.pumping)
  t.ok(s.unused, 'a watch alone holds nothing')
})

t.test('watch is refused anywhere but idle, the watch not begun', async t => {
  for (const kind of KINDS.filter(k => k !== 'idle')) {
    const { s } = await reach(kind)
    let begun = 0
    t.notOk(s.watch(() => { begun++; return () => {} }), kind)
    t.equal(begun, 0, `${kind}: not begun`)
    t.equal(s.kind, kind, `${kind}: unchanged`)
  }
})

t.test('watching → idle by stopWatching: the watch is stopped', async t => {
  const { s, unwatched } = await reach('watching')
  s.stopWatching()
  t.equal(s.kind, 'idle')
  t.equal(unwatched(), 1)
  s.stopWatching()
  t.equal(unwatched(), 1, 'once')
})

t.test('watching → idle by watchEnded: the watch ended by itself, not stopped again', async t => {
  const { s, unwatched } = await reach('watching')
  s.watchEnded()
  t.equal(s.kind, 'idle')
  t.equal(unwatched(), 0)
})

t.test('stopWatching and watchEnded change nothing anywhere but watching', async t => {
  for (const kind of KINDS.filter(k => k !== 'watching')) {
    const { s, pump } = await reach(kind)
    s.stopWatching()
    t.equal(s.kind, kind, `${kind}: stopWatching`)
    s.watchEnded()
    t.equal(s.kind, kind, `${kind}: watchEnded`)
    if (kind === 'starting' || kind === 'pumping') t.equal(s.pump, pump, `${kind}: same pump`)
  }
})

t.test('idle → opening: start runs at once, its result is the opening', async t => {
  const s = new LocalSession()
  let started = 0
  let kindAtStart: Kind | undefined
  const opened = s.open(async () => { started++; kindAtStart = s.kind; return null })
  t.equal(started, 1)
  t.equal(kindAtStart, 'opening', 'start runs in the opening state')
  t.equal(s.kind, 'opening')
  t.equal(s.opening, opened)
  t.notOk(s.pumping, 'no pump yet: not held')
  t.notOk(s.unused, 'an opening holds the session here')
  t.equal(await opened, null)
})

t.test('open is refused anywhere but idle, start not run', async t => {
  for (const kind of KINDS.filter(k => k !== 'idle')) {
    const { s, opened } = await reach(kind)
    let started = 0
    t.equal(s.open(async () => { started++; return null }), undefined, kind)
    t.equal(started, 0, `${kind}: not started`)
    t.equal(s.kind, kind, `${kind}: unchanged`)
    t.equal(s.opening, opened, `${kind}: same opening`)
  }
})

t.test('opening → idle: the opening settled without a pump (a refusal, held elsewhere, or failed)', async t => {
  for (const [what, result] of [['a refusal', refusal], ['held by another replica', null]] as const) {
    const { s, opened, settle } = await reach('opening')
    settle(result)
    t.equal(await opened, result, what)
    t.equal(s.kind, 'idle', `${what}: idle`)
  }
  const s = new LocalSession()
  const opened = s.open(async () => { throw new Error('store down') }) as Opened
  await t.rejects(opened, /store down/)
  t.equal(s.kind, 'idle', 'failed: idle')
})

t.test('a start that throws at once fails the opening, and the state goes back to idle', async t => {
  const s = new LocalSession()
  const opened = s.open(() => { throw new Error('bad') }) as Opened
  await t.rejects(opened, /bad/)
  t.equal(s.kind, 'idle')
})

t.test('opening → starting: a pump started; the stream counts as held', async t => {
  const { s, opened } = await reach('opening')
  const pump = fakePump()
  s.pumpStarted(pump)
  t.equal(s.kind, 'starting')
  t.equal(s.pump, pump)
  t.ok(s.pumping)
  t.equal(s.opening, opened, 'still opening')
})

t.test('a pump started synchronously by start (a takeover) finds the opening state', async t => {
  const s = new LocalSession()
  const pump = fakePump()
  const opened = s.open(async () => { s.pumpStarted(pump); return null })
  t.equal(s.kind, 'starting')
  await opened
  t.equal(s.kind, 'pumping')
})

t.test('pumpStarted anywhere but opening is a bug: thrown, state unchanged', async t => {
  for (const kind of KINDS.filter(k => k !== 'opening')) {
    const { s } = await reach(kind)
    t.throws(() => s.pumpStarted(fakePump()), /not opening/, kind)
    t.equal(s.kind, kind, `${kind}: unchanged`)
  }
})

t.test('starting → opening: its pump stopped (refused); the opening may start another', async t => {
  const { s, pump, opened } = await reach('starting')
  s.pumpStopped(fakePump())
  t.equal(s.kind, 'starting', 'another pump\'s stop is ignored')
  pump.stopped = true
  s.pumpStopped(pump)
  t.equal(s.kind, 'opening')
  t.equal(s.pump, undefined)
  t.equal(s.opening, opened)
  const next = fakePump()
  s.pumpStarted(next)
  t.equal(s.kind, 'starting')
  t.equal(s.pump, next)
})

t.test('starting → pumping: the opening settled with its pump running, before any awaiting caller resumes', async t => {
  const { s, pump, opened, settle } = await reach('starting')
  const seen = (opened as Opened).then(() => s.kind)
  settle(null)
  t.equal(await seen, 'pumping')
  t.equal(s.pump, pump)
  t.ok(s.pumping)
  t.equal(s.opening, undefined)
  t.notOk(s.unused)
})

t.test('starting with a pump stopped without notice settles to idle, not pumping', async t => {
  const { s, pump, opened, settle } = await reach('starting')
  pump.stopped = true
  t.notOk(s.pumping, 'a stopped pump holds nothing')
  settle(null)
  await opened
  t.equal(s.kind, 'idle')
})

t.test('pumping → idle: its pump stopped; another pump\'s stop is ignored', async t => {
  const { s, pump } = await reach('pumping')
  s.pumpStopped(fakePump())
  t.equal(s.kind, 'pumping')
  t.equal(s.pump, pump)
  s.pumpStopped(pump)
  t.equal(s.kind, 'idle')
  t.equal(s.pump, undefined)
  t.notOk(s.pumping)
})

t.test('pumpStopped changes nothing in idle, watching or opening', async t => {
  for (const kind of ['idle', 'watching', 'opening'] as const) {
    const { s, pump } = await reach(kind)
    s.pumpStopped(pump)
    t.equal(s.kind, kind, kind)
  }
})

t.test('a DELETE on its way is noted in any state and leaves the state alone', async t => {
  for (const kind of KINDS) {
    const { s } = await reach(kind)
    t.notOk(s.deleting)
    s.deleteForwarded()
    t.ok(s.deleting, `${kind}: deleting`)
    t.equal(s.kind, kind, `${kind}: unchanged`)
    s.deleteRefused()
    t.notOk(s.deleting, `${kind}: no longer`)
  }
})

t.test('the headers kept for a takeover: a standalone GET\'s fill in, a later verified request\'s replace them, a GET attaching late puts none back', async t => {
  const s = new LocalSession()
  const log = { info () {} } as never
  s.standaloneGet({ accept: 'text/event-stream' }, log)
  t.same(s.headers, { accept: 'text/event-stream' }, 'a session with none takes the GET\'s')
  t.equal(s.log, log)
  s.requestVerified({ accept: 'text/event-stream', authorization: 'Bearer refreshed' })
  t.same(s.headers, { accept: 'text/event-stream', authorization: 'Bearer refreshed' }, 'a later verified request\'s headers replace them')
  t.equal(s.log, log, 'the GET\'s logger stays')
  const later = { info () {} } as never
  s.standaloneGet({ accept: 'text/event-stream', authorization: 'Bearer old' }, later)
  t.same(s.headers, { accept: 'text/event-stream', authorization: 'Bearer refreshed' }, 'a GET verified before that request, attaching now, does not put its headers back')
  t.equal(s.log, later, 'its logger is the stream\'s')
})

t.test('LocalSessions forgets a session only when nothing is held for it, stopping its watch', async t => {
  const sessions = new LocalSessions()
  for (const kind of ['opening', 'starting', 'pumping'] as const) {
    const s = sessions.local(kind)
    let settle: (value: null) => void = () => {}
    const opened = s.open(async () => await new Promise<null>(resolve => { settle = resolve }))
    if (kind !== 'opening') s.pumpStarted(fakePump())
    if (kind === 'pumping') {
      settle(null)
      await opened
    }
    t.equal(s.kind, kind)
    sessions.forget(kind)
    t.equal(sessions.get(kind), s, `${kind}: kept`)
  }
  const withClient = sessions.local('client')
  withClient.attachClient({ streamId: STANDALONE_STREAM } as ClientStream)
  sessions.forget('client')
  t.equal(sessions.get('client'), withClient, 'a client: kept')

  let unwatched = 0
  const watching = sessions.local('watching')
  watching.watch(() => () => { unwatched++ })
  sessions.forget('watching')
  t.equal(sessions.get('watching'), undefined, 'watching alone: forgotten')
  t.equal(unwatched, 1, 'its watch stopped')

  sessions.local('idle')
  sessions.forget('idle')
  t.equal(sessions.get('idle'), undefined, 'idle: forgotten')
})

t.test('client streams: only attach adds one, only its own close removes it', async t => {
  const s = new LocalSession()
  const first = { streamId: STANDALONE_STREAM } as ClientStream
  const second = { streamId: STANDALONE_STREAM } as ClientStream
  const request = { streamId: '7' } as ClientStream
  t.equal(s.attachClient(first), undefined, 'the first connection supersedes nothing')
  t.equal(s.attachClient(first), undefined, 'attached again: it does not supersede itself')
  t.equal(s.attachClient(request), undefined, 'another stream\'s connection supersedes nothing')
  t.equal(s.attachClient(second), first, 'a newer connection to the same stream supersedes the older, for the caller to end')
  t.equal(s.standaloneClient, second)
  t.equal(s.clientCount, 2)

  s.detachClient(first)
  t.equal(s.standaloneClient, second, 'the superseded connection closing late leaves its successor attached')
  t.equal(s.localClients(), 1)

  const copy = s.clientStreams()
  s.detachClient(second)
  t.same(copy, [second, request], 'a copy: detaching while walking it changes nothing in it')
  t.equal(s.standaloneClient, undefined, 'the current connection closing detaches it')
  t.equal(s.localClients(), 0)
  s.detachClient(request)
  t.equal(s.clientCount, 0)
  t.ok(s.unused, 'no client, idle: unused')
})
