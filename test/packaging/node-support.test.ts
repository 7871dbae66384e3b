// Node.js support: package.json's engines, the Node versions CI installs and tests
// on (.ci/run, scripts/run-tests.sh) and the image's (Dockerfile) agree, and no
// package in the lockfile wants a Node those allow, so an install on a supported
// Node prints no EBADENGINE warning.
import t from 'tap'
import { readFile } from 'node:fs/promises'
import { join } from 'node:path'
import semver from 'semver'

const ROOT = join(import.meta.dirname, '..', '..')
const pkg = JSON.parse(await readFile(join(ROOT, 'package.json'), 'utf8')) as { engines: { node: string } }
const lock = JSON.parse(await readFile(join(ROOT, 'package-lock.json'), 'utf8')) as { packages: Record<string, { engines?: { node?: string } | string[] }> }
const engines = pkg.engines.node
const oldest = semver.minVersion(engines)?.version ?? ''

/** Lockfile packages whose engines.node does not accept `version`. */
function unhappyOn (version: string): string[] {
  return Object.entries(lock.packages)
    .filter(([, p]) => !Array.isArray(p.engines) && typeof p.engines?.node === 'string' && !semver.satisfies(version, p.engines.node))
    .map(([path, p]) => `${path.replace(/^node_modules\//, '')} wants ${(p.engines as { node: string }).node}`)
}

t.test('the helper finds what it exists for', async t => {
  t.ok(unhappyOn('20.0.0').some(p => p.startsWith('kubernetes-models ')), 'kubernetes-models wants Node 22')
})

t.test('no package wants more than the oldest Node engines allows, or than Node 24', async t => {
  t.ok(semver.valid(oldest), `engines ${engines} has a lowest version`)
  t.same(unhappyOn(oldest), [], `on ${oldest}`)
  t.same(unhappyOn('24.0.0'), [], 'on 24.0.0')
  t.notOk(semver.satisfies('20.19.0', engines), 'Node 20 (out of maintenance) is not supported')
})

t.test('CI and the image run Node versions engines allows', async t => {
  const ciRun = await readFile(join(ROOT, '.ci', 'run'), 'utf8')
  const runTests = await readFile(join(ROOT, 'scripts', 'run-tests.sh'), 'utf8')
  const dockerfile = await readFile(join(ROOT, 'Dockerfile'), 'utf8')
  const majors = [...`${ciRun}\n${runTests}`.matchAll(/--package node@(\d+)/g)].map(m => Number(m[1]))
  t.ok(majors.length >= 2, `CI runs on several Node lines: ${majors.join(', ')}`)
  for (const major of majors) t.ok(semver.satisfies(`${major}.99.0`, engines), `CI's Node ${major} is supported`)
  t.ok(majors.includes(semver.major(oldest)), `CI tests the oldest supported line (${semver.major(oldest)})`)
  const image = /^ARG NODE_IMAGE=node:(\d+)/m.exec(dockerfile)
  t.ok(image, 'the image\'s base is node:<major>')
  t.ok(majors.includes(Number(image?.[1])), 'CI tests the image\'s Node line')
  t.match(ciRun, /^npm ci && npm test$/m, 'CI still runs exactly npm ci && npm test')
})
