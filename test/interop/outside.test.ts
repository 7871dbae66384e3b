// MCP servers and a client this project did not write: server-everything and a
// fastmcp server, each tried with the official SDK client (default options) and
// the MCP Inspector CLI, directly and through the gateway, on both stores
// (scripts/interop-outside.mjs, which installs them from the npm registry into
// a scratch directory and runs the gateway from dist/, as `npm test` builds it).
// Every step must pass. Among them, a restart of each server under a session:
// directly the session is gone, through the gateway it goes on.
// Run alone: npm run build && npx tap --disable-coverage test/interop/outside.test.ts
import t from 'tap'
import { spawn } from 'node:child_process'
import { fileURLToPath } from 'node:url'
import { useRedis } from '../fixtures/redis.js'

const SCRIPT = fileURLToPath(new URL('../../scripts/interop-outside.mjs', import.meta.url))

t.setTimeout(900_000)

async function interop (args: string[], env: NodeJS.ProcessEnv): Promise<{ code: number | null, out: string }> {
  return await new Promise((resolve) => {
    const child = spawn(process.execPath, [SCRIPT, ...args], { env, stdio: ['ignore', 'pipe', 'pipe'] })
    let out = ''
    child.stdout.on('data', (chunk: Buffer) => { out += chunk.toString() })
    child.stderr.on('data', (chunk: Buffer) => { out += chunk.toString() })
    child.on('close', (code) => resolve({ code, out }))
  })
}

for (const store of ['embedded', 'redis'] as const) {
  t.test(`server-everything and fastmcp, the SDK client and the Inspector CLI, directly and through the gateway (${store} store)`, async t => {
    const env = { ...process.env }
    const args: string[] = []
    if (store === 'redis') {
      env.TEST_REDIS_URL = (await useRedis(t, 'interop-outside')).url
      args.push('--redis')
    }
    const { code, out } = await interop(args, env)
    const steps = out.split('\n').filter(line => /^(ok {3}|FAIL )/.test(line))
    t.equal(code, 0, `the script ran to its end${code === 0 ? '' : `: ${out.slice(-3000)}`}`)
    t.ok(steps.length >= 50, `every step ran (${steps.length})`)
    t.same(steps.filter(line => line.startsWith('FAIL')), [], 'every step passed')
    const survived = steps.filter(line => line.startsWith('ok') && line.includes('upstream restarted under the session: the next call goes on, same session'))
    t.equal(survived.length, 2, 'through the gateway, both servers\' sessions outlive a restart of the server')
  })
}
