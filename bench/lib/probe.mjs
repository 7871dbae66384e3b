// A new client during a flood, in a process of its own (the benchmark's
// client process reads the flood, and its own busy loop would be measured
// too): `probes` times, one after another, initialize then GET until the
// response head, then GET /healthz. Prints one JSON line: the times in ms.
//
//   node bench/lib/probe.mjs <port> <healthPort> <probes> <gapMs>
import { setTimeout as sleep } from 'node:timers/promises'
import { deleteSession, initialize, jsonAgent, nowMs, openStream, request } from './client.mjs'

const [port, healthPort, probes, gapMs] = process.argv.slice(2).map(Number)
const agent = jsonAgent()
const heads = []
const health = []
const ids = []
for (let i = 0; i < probes; i++) {
  const t = nowMs()
  const id = await initialize(port, agent, {})
  ids.push(id)
  const s = await openStream(port, id, { timeoutMs: 60_000 })
  heads.push(nowMs() - t)
  s.close()
  if (s.status !== 200) throw new Error(`GET answered ${s.status}`)
  const h = nowMs()
  const res = await request(healthPort, { path: '/healthz', agent, timeoutMs: 60_000 })
  health.push(nowMs() - h)
  if (res.status !== 200) throw new Error(`/healthz answered ${res.status}`)
  await sleep(gapMs)
}
for (const id of ids) await deleteSession(port, id, agent).catch(() => 0)
agent.destroy()
process.stdout.write(JSON.stringify({ heads, health }) + '\n')
