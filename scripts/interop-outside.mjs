#!/usr/bin/env node
// Tries the gateway as a new user would, in front of MCP servers this project
// did not write: `@modelcontextprotocol/server-everything` (streamableHttp mode)
// and a small `fastmcp` server (scripts/interop-fastmcp-server.mjs). For each,
// the same steps run directly and through the gateway (`node dist/src/main.js`,
// what the container runs), with the official SDK client on its DEFAULT options
// and with the MCP Inspector CLI; then each server is restarted under a session, as
// a deploy does, directly and through the gateway. Prints one line per step.
//
// Usage: npm run build && node scripts/interop-outside.mjs [--redis] [--keep=<dir>]
//   --redis   the gateway on Redis (TEST_REDIS_URL, default redis://127.0.0.1:6379;
//             a private key prefix, deleted at the end) instead of its embedded store
// The servers and the Inspector are installed by npm into a scratch directory
// and run on the npm-packaged Node 24 (the Inspector needs Node 22.19 or later).
import { spawn } from 'node:child_process'
import { copyFileSync, mkdtempSync, rmSync } from 'node:fs'
import { createServer } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { CreateMessageRequestSchema, ElicitRequestSchema, EmptyResultSchema, ListRootsRequestSchema, LoggingMessageNotificationSchema, McpError } from '@modelcontextprotocol/sdk/types.js'
import { Redis } from 'ioredis'

export const VERSIONS = {
  everything: '2026.8.31',
  fastmcp: '4.20.16',
  inspector: '2.12.0',
  node: 'node@24'
}

const { values } = parseArgs({ options: { redis: { type: 'boolean', default: false }, keep: { type: 'string' } } })
const root = fileURLToPath(new URL('..', import.meta.url))
const scratch = values.keep ?? mkdtempSync(join(tmpdir(), 'mcpgw-interop-'))
const children = new Set()
process.once('exit', () => { for (const child of children) child.kill('SIGKILL') })

function run (command, args, options = {}) {
  return new Promise((resolve) => {
    const child = spawn(command, args, { stdio: ['ignore', 'pipe', 'pipe'], ...options })
    let out = ''
    child.stdout.on('data', (c) => { out += c })
    child.stderr.on('data', (c) => { out += c })
    child.on('close', (code) => resolve({ code, out }))
  })
}

function freePort () {
  return new Promise((resolve) => {
    const server = createServer().listen(0, '127.0.0.1', () => {
      const { port } = server.address()
      server.close(() => resolve(port))
    })
  })
}

/** Starts a long-running process; resolves once `ready(output)` gives a value. */
async function start (name, command, args, env, ready) {
  const child = spawn(command, args, { env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] })
  children.add(child)
  let out = ''
  child.stdout.on('data', (c) => { out += c })
  child.stderr.on('data', (c) => { out += c })
  for (let i = 0; i < 600; i++) {
    const value = await ready(out)
    if (value !== undefined) return { child, value, output: () => out }
    if (child.exitCode !== null) throw new Error(`${name} exited: ${out.slice(-2000)}`)
    await sleep(100)
  }
  throw new Error(`${name} did not start: ${out.slice(-2000)}`)
}

async function answers (url) {
  try {
    await fetch(url, { method: 'GET', signal: AbortSignal.timeout(1000) })
    return true
  } catch {
    return undefined
  }
}

console.log(`scratch: ${scratch}`)
const npx = ['--yes', '--package', VERSIONS.node, '-c']
const install = await run('npx', [...npx, `npm install --prefix ${scratch} --no-audit --no-fund @modelcontextprotocol/server-everything@${VERSIONS.everything} fastmcp@${VERSIONS.fastmcp} zod @modelcontextprotocol/inspector@${VERSIONS.inspector} && command -v node`])
if (install.code !== 0) throw new Error(`npm install failed: ${install.out.slice(-3000)}`)
const node24 = install.out.trim().split('\n').at(-1)
copyFileSync(join(root, 'scripts/interop-fastmcp-server.mjs'), join(scratch, 'fastmcp-server.mjs'))

/**
 * One of the servers on a port of its own; `restart()` stops its process and
 * starts a new one on the same port, as a deploy does: every session it kept
 * in memory is forgotten.
 */
async function startServer (name, args, port) {
  const url = `http://127.0.0.1:${port}/mcp`
  const launch = async () => (await start(name, node24, args, { PORT: String(port) }, () => answers(url))).child
  let child = await launch()
  return {
    url,
    async restart () {
      const exited = new Promise((resolve) => child.once('close', resolve))
      child.kill('SIGTERM')
      await exited
      children.delete(child)
      child = await launch()
    }
  }
}

async function startUpstreams () {
  const everything = await startServer('server-everything', [join(scratch, 'node_modules/@modelcontextprotocol/server-everything/dist/index.js'), 'streamableHttp'], await freePort())
  const fastmcp = await startServer('fastmcp', [join(scratch, 'fastmcp-server.mjs')], await freePort())
  return [
    { name: `server-everything@${VERSIONS.everything}`, kind: 'everything', ...everything },
    { name: `fastmcp@${VERSIONS.fastmcp}`, kind: 'fastmcp', ...fastmcp }
  ]
}

/**
 * A deploy of the server under a session: the SDK client (default options)
 * calls a tool, the server restarts, the client calls again on the same
 * session. Directly, the new server knows nothing of the session (the step
 * reports the failure the client meets); through the gateway, the session
 * goes on.
 */
async function restartSteps (upstream, url, direct) {
  const client = new Client({ name: 'interop-restart', version: '1.0.0' })
  const transport = new StreamableHTTPClientTransport(new URL(url))
  const call = () => upstream.kind === 'everything'
    ? client.callTool({ name: 'echo', arguments: { message: 'again' } })
    : client.callTool({ name: 'add', arguments: { a: 1, b: 1 } })
  const started = Date.now()
  let step
  try {
    await within(20_000, client.connect(transport))
    await within(20_000, call())
    const sessionId = transport.sessionId
    await upstream.restart()
    const outcome = await within(20_000, call()).then((result) => ({ ok: result.isError !== true, detail: JSON.stringify(result.content?.[0]).slice(0, 80) }), (err) => ({ ok: false, detail: err.message.split('\n')[0].slice(0, 160) }))
    const same = transport.sessionId === sessionId
    step = direct
      ? { name: 'upstream restarted under the session: the next call (expected to fail directly)', ok: !outcome.ok, detail: `the call ${outcome.ok ? 'succeeded' : 'failed'}: ${outcome.detail}` }
      : { name: 'upstream restarted under the session: the next call goes on, same session', ok: outcome.ok && same, detail: `${outcome.detail}; session ${same ? 'kept' : 'changed'}` }
  } catch (err) {
    step = { name: 'upstream restarted under the session', ok: false, detail: err.message.split('\n')[0].slice(0, 160) }
  }
  await client.close().catch(() => {})
  return [{ ...step, ms: Date.now() - started }]
}

async function startGateway (upstreamUrl, env) {
  const { value } = await start('gateway', process.execPath, [join(root, 'dist/src/main.js')], {
    UPSTREAM_URL: upstreamUrl, HOST: '127.0.0.1', ADMIN_HOST: '127.0.0.1', PORT: '0', ADMIN_PORT: '0', LOG_LEVEL: 'info', ...env
  }, (out) => {
    const line = out.split('\n').find((l) => l.includes('"gateway listening"'))
    return line === undefined ? undefined : JSON.parse(line).url
  })
  return `${value}${new URL(upstreamUrl).pathname}`
}

const within = (ms, promise) => Promise.race([promise, sleep(ms).then(() => { throw new Error(`no answer in ${ms} ms`) })])

/** The SDK client as a new user writes it: default transport options, the capabilities a host would declare. */
async function sdkSteps (kind, url, direct) {
  const steps = []
  const step = async (name, fn) => {
    const started = Date.now()
    try {
      steps.push({ name, ok: true, detail: String(await within(20_000, fn())), ms: Date.now() - started })
    } catch (err) {
      steps.push({ name, ok: false, detail: err.message.split('\n')[0].slice(0, 200), ms: Date.now() - started })
    }
  }
  const seen = { sampling: 0, elicitation: 0, roots: 0, logs: 0 }
  const client = new Client({ name: 'interop-try', version: '1.0.0' }, { capabilities: { sampling: {}, elicitation: { form: {} }, roots: { listChanged: true } } })
  client.setRequestHandler(CreateMessageRequestSchema, () => { seen.sampling++; return { role: 'assistant', content: { type: 'text', text: 'hello from the client' }, model: 'test', stopReason: 'endTurn' } })
  client.setRequestHandler(ElicitRequestSchema, (request) => {
    seen.elicitation++
    const properties = request.params.requestedSchema?.properties ?? {}
    const content = {}
    for (const [key, schema] of Object.entries(properties)) {
      content[key] = schema.type === 'boolean' ? true : schema.type === 'number' || schema.type === 'integer' ? (schema.minimum ?? 1) : schema.enum?.[0] ?? schema.oneOf?.[0]?.const ?? (schema.format === 'email' ? 'a@example.com' : schema.format === 'uri' ? 'https://example.com' : schema.format === 'date' ? '2026-01-01' : 'x')
    }
    return { action: 'accept', content }
  })
  client.setRequestHandler(ListRootsRequestSchema, () => { seen.roots++; return { roots: [{ uri: 'file:///tmp', name: 'tmp' }] } })
  client.setNotificationHandler(LoggingMessageNotificationSchema, () => { seen.logs++ })
  // A tool result with isError counts as a failed step.
  const call = async (...args) => {
    const result = await client.callTool(...args)
    if (result.isError === true) throw new Error(`isError: ${result.content?.[0]?.text ?? ''}`)
    return result
  }
  // Resumes the transport makes (a GET with Last-Event-ID), counted.
  let resumes = 0
  const countingFetch = async (input, init) => {
    if ((init?.method ?? 'GET') === 'GET' && new Headers(init?.headers).has('last-event-id')) resumes++
    return await fetch(input, init)
  }
  const transport = new StreamableHTTPClientTransport(new URL(url), { fetch: countingFetch })
  await step('initialize', async () => { await client.connect(transport); return `session ${transport.sessionId?.slice(0, 8)}…, protocol ${transport.protocolVersion}` })
  await step('tools/list', async () => `${(await client.listTools()).tools.length} tools`)
  if (kind === 'everything') {
    await step('tools/call echo', async () => (await call({ name: 'echo', arguments: { message: 'hi' } })).content[0].text)
    await step('progress (trigger-long-running-operation 5 steps)', async () => {
      let progress = 0
      await call({ name: 'trigger-long-running-operation', arguments: { duration: 2, steps: 5 } }, undefined, { onprogress: () => { progress++ } })
      if (progress < 5) throw new Error(`${progress} of 5 progress notifications`)
      return `${progress} progress notifications`
    })
    await step('sampling (trigger-sampling-request)', async () => JSON.stringify((await call({ name: 'trigger-sampling-request', arguments: { prompt: 'hi', maxTokens: 10 } })).content[0]).slice(0, 80))
    await step('elicitation (trigger-elicitation-request)', async () => JSON.stringify((await call({ name: 'trigger-elicitation-request', arguments: {} })).content[0]).slice(0, 80))
    await step('roots (get-roots-list; the server asks roots/list right after initialize)', async () => `${seen.roots} roots/list request(s) reached the client; tool: ${JSON.stringify((await call({ name: 'get-roots-list', arguments: {} })).content[0]).slice(0, 80)}`)
    await step('standalone logging (toggle-simulated-logging, 3 s)', async () => {
      await client.setLoggingLevel('debug')
      const before = seen.logs
      await call({ name: 'toggle-simulated-logging', arguments: {} })
      await sleep(3000)
      await call({ name: 'toggle-simulated-logging', arguments: {} })
      if (seen.logs === before) throw new Error('no notifications/message on the standalone stream')
      return `${seen.logs - before} notifications/message`
    })
    await step('resources/list + read', async () => {
      const { resources } = await client.listResources()
      const read = await client.readResource({ uri: resources[0].uri })
      return `${resources.length} resources, read ${read.contents.length} content(s)`
    })
    await step('prompts/get simple-prompt', async () => `${(await client.getPrompt({ name: 'simple-prompt' })).messages.length} message(s)`)
  } else {
    await step('tools/call add', async () => (await call({ name: 'add', arguments: { a: 2, b: 3 } })).content[0].text)
    await step('progress + logging (count 5)', async () => {
      let progress = 0
      const before = seen.logs
      await client.setLoggingLevel('debug').catch(() => {})
      await call({ name: 'count', arguments: { steps: 5 } }, undefined, { onprogress: () => { progress++ } })
      await sleep(200)
      if (progress < 5) throw new Error(`${progress} of 5 progress notifications, ${seen.logs - before} log messages`)
      return `${progress} progress, ${seen.logs - before} log messages`
    })
    await step('sampling (ask-llm)', async () => (await call({ name: 'ask-llm', arguments: { prompt: 'hi' } })).content[0].text)
    await step('elicitation (confirm)', async () => (await call({ name: 'confirm', arguments: {} })).content[0].text)
  }
  // The SDK client resumes a request stream that ended without a result (an error answer
  // does not count): through the gateway once, held open, where it once looped.
  await step(`an error answer, then 3 s${direct ? '' : ' (resumed once at most: no reconnection loop)'}`, async () => {
    const before = resumes
    const err = await client.request({ method: 'tools/nonexistent' }, EmptyResultSchema).then(() => undefined, e => e)
    if (!(err instanceof McpError)) throw new Error(`no JSON-RPC error answer: ${String(err)}`)
    await sleep(3000)
    const count = resumes - before
    if (!direct && count > 1) throw new Error(`error ${err.code}, then ${count} resumes in 3 s: a reconnection loop`)
    return `error ${err.code}, then ${count} resume(s) in 3 s`
  })
  await step('DELETE (terminateSession)', async () => { await transport.terminateSession(); return 'ok' })
  await client.close().catch(() => {})
  return steps
}

async function inspectorSteps (kind, url) {
  const bin = join(scratch, 'node_modules/.bin/mcp-inspector')
  const calls = kind === 'everything'
    ? [['tools/list'], ['tools/call', '--tool-name', 'echo', '--tool-arg', 'message=hi'], ['resources/list'], ['prompts/get', '--prompt-name', 'simple-prompt']]
    : [['tools/list'], ['tools/call', '--tool-name', 'add', '--tool-arg', 'a=2', 'b=3']]
  const steps = []
  for (const [method, ...rest] of calls) {
    const started = Date.now()
    const { code, out } = await run(node24, [bin, '--cli', url, '--transport', 'http', '--method', method, ...rest], { env: { ...process.env, HOME: scratch } })
    const first = out.trim().replace(/\s+/g, ' ').slice(0, 160)
    steps.push({ name: `inspector ${method}${rest.length > 0 ? ` ${rest[1]}` : ''}`, ok: code === 0, detail: `exit ${code}: ${first}`, ms: Date.now() - started })
  }
  return steps
}

const env = {}
let prefix
if (values.redis) {
  prefix = `mcpgw-interop:${process.pid}:`
  Object.assign(env, { REDIS_URL: process.env.TEST_REDIS_URL ?? 'redis://127.0.0.1:6379', REDIS_KEY_PREFIX: prefix })
}
try {
  for (const upstream of await startUpstreams()) {
    const gateway = await startGateway(upstream.url, env)
    for (const [path, url] of [['direct', upstream.url], [`gateway (${values.redis ? 'Redis' : 'embedded store'})`, gateway]]) {
      console.log(`\n== ${upstream.name}, ${path}: ${url}`)
      const steps = [...await sdkSteps(upstream.kind, url, path === 'direct'), ...await inspectorSteps(upstream.kind, url), ...await restartSteps(upstream, url, path === 'direct')]
      for (const s of steps) {
        console.log(`${s.ok ? 'ok  ' : 'FAIL'} ${s.name} (${s.ms} ms): ${s.detail}`)
      }
    }
  }
} finally {
  for (const child of children) child.kill('SIGTERM')
  if (prefix !== undefined) {
    const redis = new Redis(env.REDIS_URL)
    for await (const keys of redis.scanStream({ match: `${prefix}*`, count: 1000 })) if (keys.length > 0) await redis.unlink(...keys)
    redis.disconnect()
  }
  if (values.keep === undefined) rmSync(scratch, { recursive: true, force: true })
}
