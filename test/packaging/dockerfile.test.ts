// The Dockerfile, checked without Docker. First its shape: multi-stage on
// node:24, production dependencies only, numeric non-root USER, exec-form CMD and
// HEALTHCHECK without curl. Then its runtime stage is replayed in an empty folder
// (COPY, RUN npm ci, ENV), and the result is started with only the environment the
// image sets: the HEALTHCHECK command must pass and SIGTERM must end the gateway
// cleanly. dist/ must be built first (`npm run build`, which npm test runs).
import t from 'tap'
import { execFile, spawn, type ChildProcess } from 'node:child_process'
import { once } from 'node:events'
import { existsSync } from 'node:fs'
import { cp, mkdir, mkdtemp, readFile, readdir, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { dirname, join, relative, resolve } from 'node:path'
import { promisify } from 'node:util'
import { ConfigSchema } from '../../src/config/schema.js'
import { parseStartScript } from '../../scripts/start-script.mjs'
import { freePort, onFreePorts } from '../fixtures/net.js'

const run = promisify(execFile)
const ROOT = join(import.meta.dirname, '..', '..')
const BUILD_HINT = 'dist/ is not built: run `npm run build` (tsc -p tsconfig.build.json) before the packaging tests'

// ---------------------------------------------------------------------------
// Dockerfile parsing

interface Instruction { line: number, keyword: string, flags: Record<string, string>, args: string }
interface Stage { image: string, name: string | undefined, instructions: Instruction[] }

/** Instructions with continuation lines joined, comments dropped, --flags split off. */
function parseDockerfile (text: string): Instruction[] {
  const instructions: Instruction[] = []
  const lines = text.split('\n')
  for (let i = 0; i < lines.length; i++) {
    const start = i
    let line = lines[i] as string
    if (/^\s*(#|$)/.test(line)) continue
    while (/\\\s*$/.test(line) && i + 1 < lines.length) {
      i++
      const next = lines[i] as string
      if (/^\s*#/.test(next)) continue
      line = line.replace(/\s*\\\s*$/, ' ') + next.trim()
    }
    const m = /^\s*([A-Za-z]+)\s+(.*)$/.exec(line)
    if (m === null) throw new Error(`line ${start + 1}: cannot parse "${line}"`)
    let args = (m[2] as string).trim()
    const flags: Record<string, string> = {}
    let flag: RegExpExecArray | null
    while ((flag = /^--([a-z-]+)(?:=(\S*))?\s+/.exec(args)) !== null) {
      flags[flag[1] as string] = flag[2] ?? 'true'
      args = args.slice(flag[0].length)
    }
    instructions.push({ line: start + 1, keyword: (m[1] as string).toUpperCase(), flags, args })
  }
  return instructions
}

/** Stages, with `${ARG}` in FROM replaced by the default of an ARG declared before the first FROM. */
function stagesOf (instructions: Instruction[]): Stage[] {
  const stages: Stage[] = []
  const args: Record<string, string> = {}
  for (const ins of instructions) {
    if (ins.keyword === 'ARG' && stages.length === 0) {
      const [name, value] = ins.args.split('=')
      args[name as string] = value ?? ''
    } else if (ins.keyword === 'FROM') {
      const m = /^(\S+)(?:\s+AS\s+(\S+))?$/i.exec(ins.args)
      const image = (m?.[1] ?? ins.args).replace(/\$\{(\w+)\}/g, (_, name: string) => args[name] ?? '')
      stages.push({ image, name: m?.[2], instructions: [] })
    } else {
      stages.at(-1)?.instructions.push(ins)
    }
  }
  return stages
}

/** JSON exec form (`["node", "x"]`), or undefined for shell form. */
function execForm (args: string): string[] | undefined {
  if (!args.trim().startsWith('[')) return undefined
  const parsed = JSON.parse(args) as unknown
  return Array.isArray(parsed) && parsed.every(a => typeof a === 'string') ? parsed : undefined
}

/** ENV in both forms: `ENV A=1 B="two"` and `ENV A 1`. */
function envOf (instruction: Instruction): Record<string, string> {
  const env: Record<string, string> = {}
  if (!/^[A-Za-z_][A-Za-z0-9_]*=/.test(instruction.args)) {
    const [key, ...rest] = instruction.args.split(/\s+/)
    env[key as string] = rest.join(' ')
    return env
  }
  for (const m of instruction.args.matchAll(/([A-Za-z_][A-Za-z0-9_]*)=("(?:[^"\\]|\\.)*"|\S*)/g)) {
    const raw = m[2] as string
    env[m[1] as string] = raw.startsWith('"') ? JSON.parse(raw) as string : raw
  }
  return env
}

function healthcheckOf (instruction: Instruction): { options: Record<string, string>, command: string[] | undefined } {
  const m = /^CMD\s+(.*)$/s.exec(instruction.args)
  return { options: instruction.flags, command: m === null ? undefined : execForm(m[1] as string) }
}

/** Whether .dockerignore keeps a context path (last matching rule wins, as in Docker). */
function dockerignoreKeeps (rules: string[], path: string): boolean {
  let kept = true
  const toRegExp = (pattern: string): RegExp => new RegExp('^' + pattern
    .replace(/\/+$/, '')
    .replace(/[.+^${}()|[\]\\]/g, '\\$&')
    .replace(/\*\*\//g, '<globstar/>')
    .replace(/\*\*/g, '.*')
    .replace(/\*/g, '[^/]*')
    .replace(/\?/g, '[^/]')
    .replace(/<globstar\/>/g, '(?:.*/)?') + '(?:/.*)?$')
  for (const rule of rules) {
    const negated = rule.startsWith('!')
    if (toRegExp(negated ? rule.slice(1) : rule).test(path)) kept = negated
  }
  return kept
}

function dockerignoreRules (text: string): string[] {
  return text.split('\n').map(l => l.trim()).filter(l => l !== '' && !l.startsWith('#'))
}

// ---------------------------------------------------------------------------
// Process helpers

interface Started { child: ChildProcess, output: () => string }

function start (cwd: string, args: string[], env: Record<string, string>): Started {
  const child = spawn(process.execPath, args, { cwd, env, stdio: ['ignore', 'pipe', 'pipe'] })
  let output = ''
  child.stdout?.on('data', (chunk: Buffer) => { output += chunk.toString() })
  child.stderr?.on('data', (chunk: Buffer) => { output += chunk.toString() })
  return { child, output: () => output.slice(-4000) }
}

async function exitOf (child: ChildProcess, timeoutMs: number): Promise<{ code: number | null, signal: string | null }> {
  if (child.exitCode !== null || child.signalCode !== null) return { code: child.exitCode, signal: child.signalCode }
  const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs)
  const [code, signal] = await once(child, 'exit') as [number | null, string | null]
  clearTimeout(timer)
  return { code, signal }
}

/** Polls probe until it answers true; a probe that throws ends the wait. */
async function until (what: string, deadlineMs: number, probe: () => Promise<boolean>): Promise<void> {
  const deadline = Date.now() + deadlineMs
  while (Date.now() < deadline) {
    if (await probe()) return
    await new Promise(resolve => setTimeout(resolve, 200))
  }
  throw new Error(`timed out waiting for ${what}`)
}

/**
 * Starts a process (on ports picked free by onFreePorts, which starts it again
 * on others if it exits with EADDRINUSE) and waits until `ready` answers true;
 * any other exit ends the wait.
 */
async function startUntil (what: string, count: number, launch: (ports: number[]) => Started, ready: () => Promise<boolean>): Promise<Started> {
  return await onFreePorts(count, async (ports) => {
    const started = launch(ports)
    try {
      await until(what, 20_000, async () => {
        if (started.child.exitCode !== null) throw new Error(`exited (${started.child.exitCode})`)
        return await ready()
      })
      return started
    } catch (err) {
      throw new Error(`${what}: ${(err as Error).message}\n${started.output()}`)
    }
  })
}

/** Runs the HEALTHCHECK command as Docker would (in WORKDIR, with the container env); its exit code. */
async function runHealthcheck (command: string[], cwd: string, env: Record<string, string>): Promise<number> {
  const [program, ...args] = command
  const executable = program === 'node' ? process.execPath : program as string
  return await run(executable, args, { cwd, env, timeout: 10_000 }).then(() => 0, (err: { code?: number }) => typeof err.code === 'number' ? err.code : 1)
}

/** Bare module specifiers imported by the compiled code (node: builtins and relative paths excluded). */
async function bareImports (dir: string): Promise<string[]> {
  const specs = new Set<string>()
  const walk = async (d: string): Promise<void> => {
    for (const entry of await readdir(d, { withFileTypes: true })) {
      const path = join(d, entry.name)
      if (entry.isDirectory()) await walk(path)
      else if (entry.name.endsWith('.js')) {
        const code = await readFile(path, 'utf8')
        for (const m of code.matchAll(/(?:\bfrom\s*|\bimport\s*\(\s*|^\s*import\s+)['"]([^'"]+)['"]/gm)) specs.add(m[1] as string)
      }
    }
  }
  await walk(dir)
  return [...specs].filter(s => !s.startsWith('.') && !s.startsWith('/') && !s.startsWith('node:')).sort()
}

// ---------------------------------------------------------------------------

const dockerfile = await readFile(join(ROOT, 'Dockerfile'), 'utf8')
const instructions = parseDockerfile(dockerfile)
const stages = stagesOf(instructions)
const runtime = stages.at(-1) as Stage
const build = stages[0] as Stage
const of = (stage: Stage, keyword: string): Instruction[] => stage.instructions.filter(i => i.keyword === keyword)
const lastOf = (stage: Stage, keyword: string): Instruction | undefined => of(stage, keyword).at(-1)
const pkg = JSON.parse(await readFile(join(ROOT, 'package.json'), 'utf8')) as { scripts: Record<string, string> }
/** What `npm start` runs: its environment, node flags and script. */
const startScript = parseStartScript(pkg.scripts.start ?? '')

t.test('the parser', async t => {
  const parsed = parseDockerfile('# c\nFROM a AS b\nRUN x \\\n  # note\n  && y\nCOPY --from=b --chown=1:1 /s ./d\nENV A=1 B="t w"\nENV C 3\n')
  t.same(parsed.map(i => [i.line, i.keyword, i.args]), [[2, 'FROM', 'a AS b'], [3, 'RUN', 'x && y'], [6, 'COPY', '/s ./d'], [7, 'ENV', 'A=1 B="t w"'], [8, 'ENV', 'C 3']])
  t.same(parsed[2]?.flags, { from: 'b', chown: '1:1' })
  t.same(envOf(parsed[3] as Instruction), { A: '1', B: 't w' })
  t.same(envOf(parsed[4] as Instruction), { C: '3' })
  t.same(execForm('["node", "x"]'), ['node', 'x'])
  t.equal(execForm('node x'), undefined)
  const rules = ['*', '!src/', '!package.json', '**/*.log']
  t.ok(dockerignoreKeeps(rules, 'src/main.ts'))
  t.ok(dockerignoreKeeps(rules, 'package.json'))
  t.notOk(dockerignoreKeeps(rules, 'src/debug.log'))
  t.notOk(dockerignoreKeeps(rules, 'node_modules/x/index.js'))
  t.notOk(dockerignoreKeeps(rules, 'package.json.bak'))
})

t.test('multi-stage build on Node 24', async t => {
  t.ok(stages.length >= 2, 'at least a build and a runtime stage')
  for (const stage of stages) {
    if (stages.some(s => s.name === stage.image)) continue // built on an earlier stage
    t.match(stage.image, /^node:24(-|$|\.)/, `${stage.name ?? stage.image} uses node:24`)
  }
  t.match(runtime.image, /^node:24(\.\d+)*-(slim|alpine)/, 'a slim runtime base')
  const buildRuns = of(build, 'RUN').map(i => i.args)
  t.ok(buildRuns.some(r => /\bnpm ci\b/.test(r) && !/--omit=dev/.test(r)), 'the build stage installs dev dependencies')
  t.ok(buildRuns.some(r => /\bnpm run build\b/.test(r)), 'the build stage runs npm run build')
  const runtimeRuns = of(runtime, 'RUN').map(i => i.args)
  t.ok(runtimeRuns.some(r => /\bnpm ci\b.*--omit=dev/.test(r)), 'the runtime stage installs production dependencies only')
  const fromBuild = of(runtime, 'COPY').filter(c => c.flags.from === build.name)
  t.ok(fromBuild.some(c => /\/dist\/src\b/.test(c.args)), 'the runtime stage takes dist/src from the build stage (not the examples)')
})

t.test('the example server has its own target; the runtime stage is the default', async t => {
  const example = stages.find(s => s.name === 'example')
  t.ok(example, 'a stage named example')
  t.equal(example?.image, build.name, 'built on the build stage (its dev dependencies hold the MCP SDK)')
  t.same(execForm(lastOf(example as Stage, 'CMD')?.args ?? ''), ['node', 'dist/examples/mcp-server.js'])
  t.equal(runtime.name, 'runtime', 'the last stage, so a plain docker build gives the gateway')
  const pkg = JSON.parse(await readFile(join(ROOT, 'package.json'), 'utf8')) as { dependencies: Record<string, string>, devDependencies: Record<string, string> }
  for (const name of ['@modelcontextprotocol/sdk', 'zod']) {
    t.notOk(name in pkg.dependencies, `${name} is not a production dependency`)
    t.ok(name in pkg.devDependencies, `${name} is a dev dependency (examples and tests)`)
  }
})

t.test('runtime image labels', async t => {
  const pkg = JSON.parse(await readFile(join(ROOT, 'package.json'), 'utf8')) as { version: string, license: string }
  const labels: Record<string, string> = {}
  for (const label of of(runtime, 'LABEL')) {
    for (const m of label.args.matchAll(/([A-Za-z0-9_.-]+)="((?:[^"\\]|\\.)*)"/g)) labels[m[1] as string] = m[2] as string
  }
  t.equal(labels['org.opencontainers.image.title'], 'mcp-resumable-gateway')
  t.equal(labels['org.opencontainers.image.version'], pkg.version, 'the version of package.json')
  t.equal(labels['org.opencontainers.image.licenses'], pkg.license)
  t.type(labels['org.opencontainers.image.description'], 'string')
})

t.test('runtime image settings', async t => {
  const env = Object.assign({}, ...of(runtime, 'ENV').map(envOf)) as Record<string, string>
  t.equal(env.NODE_ENV, 'production')
  const user = lastOf(runtime, 'USER')?.args ?? ''
  t.match(user, /^\d+(:\d+)?$/, 'USER is numeric (uid[:gid]) so runAsNonRoot can verify it')
  t.not(Number(user.split(':')[0]), 0, 'USER is not root')
  const userIndex = runtime.instructions.indexOf(lastOf(runtime, 'USER') as Instruction)
  t.ok(runtime.instructions.slice(userIndex).every(i => i.keyword !== 'RUN' && i.keyword !== 'COPY'),
    'files are installed as root before USER: the process cannot modify them')
  const exposed = of(runtime, 'EXPOSE').flatMap(i => i.args.split(/\s+/)).map(p => Number(p.split('/')[0]))
  t.same(exposed.sort(), [ConfigSchema.properties.PORT.default, ConfigSchema.properties.ADMIN_PORT.default].sort(), 'EXPOSE PORT and ADMIN_PORT')
  t.equal(lastOf(runtime, 'STOPSIGNAL')?.args, 'SIGTERM')
  const cmd = execForm(lastOf(runtime, 'CMD')?.args ?? '')
  t.equal(startScript.main, 'dist/src/main.js', 'npm start runs the build')
  t.same(cmd, ['node', ...startScript.flags, startScript.main], 'CMD in exec form (node is PID 1 and gets SIGTERM), with the node flags of npm start')
  t.ok(startScript.flags.includes('--no-memory-reducer'), 'npm start keeps V8\'s heap growing under load after a quiet spell')
  t.ok(startScript.flags.includes('--heap-growing-percent=200'), 'npm start leaves the heap room for the ArrayBuffer bytes a flood allocates between full collections')
  t.ok(startScript.flags.includes('--max-semi-space-size=16'), 'npm start bounds the young generation as Node 20 did (Node 24 lets it grow to 2 x 64 MB, which idle streams pay for)')
  t.match(startScript.env.GLIBC_TUNABLES, /trim_threshold=\d+/, 'npm start keeps glibc from handing freed memory back to the kernel after every large buffer')
  for (const [name, value] of Object.entries(startScript.env)) t.equal(env[name], value, `the image sets ${name} as npm start does`)
  const healthcheck = healthcheckOf(lastOf(runtime, 'HEALTHCHECK') as Instruction)
  t.ok(healthcheck.command !== undefined, 'HEALTHCHECK CMD in exec form')
  t.equal(healthcheck.command?.[0], 'node', 'HEALTHCHECK uses node')
  t.notOk((healthcheck.command ?? []).some(a => /\b(curl|wget)\b/.test(a)), 'no curl or wget (not in the image)')
  for (const option of ['interval', 'timeout', 'start-period']) t.ok(option in healthcheck.options, `HEALTHCHECK --${option}`)
})

t.test('the build stage copies everything tsconfig.build.json compiles', async t => {
  const copied = of(build, 'COPY').filter(c => c.flags.from === undefined)
    .flatMap(c => (execForm(c.args) ?? c.args.split(/\s+/)).slice(0, -1))
    .map(source => source.replace(/^\.\//, '').replace(/\/$/, ''))
  const buildConfig = JSON.parse(await readFile(join(ROOT, 'tsconfig.build.json'), 'utf8')) as { extends?: string, include?: string[] }
  for (const needed of [...(buildConfig.include ?? []), 'tsconfig.build.json', (buildConfig.extends ?? '').replace(/^\.\//, ''), 'package.json', 'package-lock.json']) {
    if (needed === '') continue
    t.ok(copied.includes(needed), `build stage copies ${needed}`)
  }
})

t.test('.dockerignore keeps every COPY source and drops local state', async t => {
  const rules = dockerignoreRules(await readFile(join(ROOT, '.dockerignore'), 'utf8'))
  for (const copy of instructions.filter(i => i.keyword === 'COPY' && i.flags.from === undefined)) {
    const sources = (execForm(copy.args) ?? copy.args.split(/\s+/)).slice(0, -1)
    for (const source of sources) t.ok(dockerignoreKeeps(rules, source.replace(/^\.\//, '').replace(/\/$/, '')), `line ${copy.line}: ${source} reaches the build context`)
  }
  for (const path of ['node_modules/fastify/package.json', 'dist/src/main.js', '.git/config', '.env', 'test/e2e/x.test.ts', 'coverage/index.html']) {
    t.notOk(dockerignoreKeeps(rules, path), `${path} stays out of the context`)
  }
})

t.test('the runtime stage, replayed without Docker, starts, passes its HEALTHCHECK and drains on SIGTERM', async t => {
  for (const entry of ['dist/src/main.js', 'dist/examples/mcp-server.js']) {
    if (!existsSync(join(ROOT, entry))) {
      t.fail(`${entry} is missing. ${BUILD_HINT}`)
      return
    }
  }
  const app = await mkdtemp(join(tmpdir(), 'mcpgw-image-'))
  t.teardown(() => rm(app, { recursive: true, force: true }))
  for (let dir = dirname(app); dir !== dirname(dir); dir = dirname(dir)) {
    t.notOk(existsSync(join(dir, 'node_modules')), `no node_modules above the replay folder (${dir}) to hide a missing dependency`)
  }

  // Replay: WORKDIR is the temp folder; COPY from the context is a copy from the
  // repository; COPY --from=build takes what `npm run build` produced here.
  const workdirOf = (stage: Stage): string => lastOf(stage, 'WORKDIR')?.args ?? '/'
  const runtimeWorkdir = workdirOf(runtime)
  const inApp = (dest: string): string => resolve(app, relative(runtimeWorkdir, resolve(runtimeWorkdir, dest)))
  const env: Record<string, string> = {}
  for (const ins of runtime.instructions) {
    if (ins.keyword === 'ENV') Object.assign(env, envOf(ins))
    if (ins.keyword === 'COPY') {
      const parts = execForm(ins.args) ?? ins.args.split(/\s+/)
      const dest = parts.at(-1) as string
      for (const source of parts.slice(0, -1)) {
        let from = join(ROOT, source)
        if (ins.flags.from !== undefined) {
          const stage = stages.find(s => s.name === ins.flags.from)
          t.ok(stage, `COPY --from=${ins.flags.from} names a stage`)
          from = join(ROOT, relative(workdirOf(stage as Stage), source))
        }
        const target = dest.endsWith('/') || parts.length > 2 ? join(inApp(dest), source.split('/').filter(Boolean).at(-1) as string) : inApp(dest)
        await mkdir(dirname(target), { recursive: true })
        await cp(from, target, { recursive: true })
      }
    }
    if (ins.keyword === 'RUN') {
      for (const command of ins.args.split('&&').map(c => c.trim())) {
        if (/^npm cache clean\b/.test(command)) continue // only shrinks the layer; would wipe this machine's cache
        const npmCi = /^npm ci(\s.*)?$/.exec(command)
        if (npmCi === null) {
          t.fail(`line ${ins.line}: cannot replay RUN ${command}; teach test/packaging/dockerfile.test.ts`)
          return
        }
        const args = ['ci', ...(npmCi[1] ?? '').trim().split(/\s+/).filter(Boolean), '--prefer-offline']
        if (!args.includes('--ignore-scripts')) args.push('--ignore-scripts')
        await run('npm', args, { cwd: app, env: { ...process.env, NODE_ENV: env.NODE_ENV ?? '' }, timeout: 240_000 })
      }
    }
  }
  t.ok(existsSync(join(app, 'dist', 'src', 'main.js')), 'dist/ is in place')
  t.notOk(existsSync(join(app, 'node_modules', 'typescript')), 'no dev dependencies installed')
  for (const name of ['@modelcontextprotocol/sdk', 'zod', 'express', 'hono']) {
    t.notOk(existsSync(join(app, 'node_modules', name)), `${name} is not in the production install (the example server's, not the gateway's)`)
  }

  // Every package the compiled code imports (lazily loaded ones too) resolves
  // from the production dependencies alone.
  t.notOk(existsSync(join(app, 'dist', 'examples')), 'no example code in the runtime image')
  // `npm start` on the production install runs dist/ as built: no build step
  // (tsc is a dev dependency). Without UPSTREAM_URL the gateway itself refuses to start.
  const npmStart = await run('npm', ['start', '--silent'], { cwd: app, env: { ...env, PATH: process.env.PATH ?? '' }, timeout: 30_000 }).then(
    r => ({ code: 0, output: r.stdout + r.stderr }),
    (err: { code?: number, stdout?: string, stderr?: string }) => ({ code: err.code ?? 1, output: (err.stdout ?? '') + (err.stderr ?? '') }))
  t.not(npmStart.code, 0)
  t.match(npmStart.output, /UPSTREAM_URL/, 'npm start reached the gateway\'s own configuration check')
  t.notMatch(npmStart.output, /not found|tsc/, 'and ran no build')
  const specifiers = await bareImports(join(app, 'dist'))
  const checker = join(app, 'resolve-check.mjs')
  await writeFile(checker, `const missing = []\nfor (const s of ${JSON.stringify(specifiers)}) { try { import.meta.resolve(s) } catch { missing.push(s) } }\nconsole.log(JSON.stringify(missing))\n`)
  const { stdout } = await run(process.execPath, [checker], { cwd: app, env })
  await rm(checker)
  t.same(JSON.parse(stdout), [], `every import of dist/ resolves from production dependencies (${specifiers.length} packages)`)

  const healthcheck = healthcheckOf(lastOf(runtime, 'HEALTHCHECK') as Instruction).command as string[]
  const CMD = execForm(lastOf(runtime, 'CMD')?.args ?? '') as string[]
  // Ports are picked free before the processes bind them (the HEALTHCHECK reads
  // ADMIN_PORT from the environment); one taken meanwhile by another test's
  // connection makes the process exit with EADDRINUSE, and it starts again on others.
  const nothingListens = { PORT: String(await freePort()), ADMIN_PORT: String(await freePort()) }
  t.not(await runHealthcheck(healthcheck, app, { ...env, ...nothingListens }), 0, 'the HEALTHCHECK fails while nothing listens')

  // The example upstream, as the example target runs it: from the build stage
  // (here, the repository with its dev dependencies).
  let upstreamPort = 0
  const upstream = await startUntil('the example upstream', 1, ([p]) => {
    upstreamPort = p as number
    const started = start(ROOT, ['dist/examples/mcp-server.js'], { ...env, PORT: String(upstreamPort) })
    t.teardown(() => { started.child.kill('SIGKILL') })
    return started
  }, async () => await fetch(`http://127.0.0.1:${upstreamPort}/healthz`, { signal: AbortSignal.timeout(2000) }).then(r => r.ok, () => false))

  t.equal(CMD[0], 'node', 'CMD runs node')
  let port = 0
  let adminPort = 0
  let containerEnv: Record<string, string> = env
  let healthy = 1
  const gateway = await startUntil('the HEALTHCHECK to pass', 2, ([p, a]) => {
    [port, adminPort] = [p as number, a as number]
    containerEnv = { ...env, PORT: String(port), ADMIN_PORT: String(adminPort) }
    const started = start(app, CMD.slice(1), { ...containerEnv, UPSTREAM_URL: `http://127.0.0.1:${upstreamPort}/mcp` })
    t.teardown(() => { started.child.kill('SIGKILL') })
    return started
  }, async () => {
    healthy = await runHealthcheck(healthcheck, app, containerEnv)
    return healthy === 0
  }).catch(err => { t.fail((err as Error).message); return undefined })
  t.equal(healthy, 0, 'the HEALTHCHECK command exits 0')
  if (gateway === undefined) return

  const ready = await fetch(`http://127.0.0.1:${adminPort}/readyz`)
  t.equal(ready.status, 200, '/readyz')
  await ready.body?.cancel()
  const initialize = await fetch(`http://127.0.0.1:${port}/mcp`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'packaging-test', version: '0' } } })
  })
  t.equal(initialize.status, 200, 'an MCP initialize goes through the gateway to the upstream', { output: gateway.output() })
  await initialize.text()

  const grace = Number(env.SHUTDOWN_GRACE_SECONDS ?? ConfigSchema.properties.SHUTDOWN_GRACE_SECONDS.default)
  gateway.child.kill('SIGTERM')
  const gatewayExit = await exitOf(gateway.child, (grace + 5) * 1000)
  t.same(gatewayExit, { code: 0, signal: null }, 'SIGTERM ends the gateway cleanly within SHUTDOWN_GRACE_SECONDS', { output: gateway.output() })

  upstream.child.kill('SIGTERM')
  const upstreamExit = await exitOf(upstream.child, 10_000)
  t.same(upstreamExit, { code: 0, signal: null }, 'SIGTERM ends the example upstream cleanly (docker-compose stops it so)', { output: upstream.output() })
})
