// Checks that need a tool npm does not install: skipped with their reason on a
// laptop, mandatory (run, and failed) in CI.
import t from 'tap'
import type { Test } from 'tap'
import { chmod, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { basename, join } from 'node:path'
import { externalTool, externalTools, TOOLS } from '../fixtures/external-tools.js'

const ROOT = join(import.meta.dirname, '..', '..')

const NOWHERE = { PATH: join(tmpdir(), 'mcpgw-no-such-dir') }

/** A Test that only records what fail() was given. */
function recorder (): { t: Test, failures: string[] } {
  const failures: string[] = []
  return { t: { fail: (message: string) => { failures.push(message); return false } } as unknown as Test, failures }
}

t.test('missing outside CI: skipped, saying what is not checked and how to install it', async t => {
  const tool = await externalTool('promtool', NOWHERE)
  t.equal(tool.command, undefined)
  t.match(tool.skip, /^SKIPPED: promtool is not installed \(Debian package prometheus\): run `sh scripts\/install-packaging-tools.sh`.*alert rules .*NOT checked.*mandatory in CI/)
  const compose = await externalTool('compose', { ...NOWHERE, CI: 'false' })
  t.match(compose.skip, /docker-compose.yml was NOT validated/)
})

t.test('missing in CI: not skipped, and the check fails with the install hint', async t => {
  const tool = await externalTool('redis-server', { ...NOWHERE, CI: 'true' })
  t.equal(tool.skip, false)
  const { t: fake, failures } = recorder()
  t.equal(tool.require(fake), undefined)
  t.match(failures, [/redis-server is not installed .*install-packaging-tools.*CI=true makes it mandatory/])
})

t.test('present: run, in CI or not', async t => {
  const dir = await mkdtemp(join(tmpdir(), 'mcpgw-tools-'))
  t.teardown(() => rm(dir, { recursive: true, force: true }))
  await writeFile(join(dir, 'promtool'), '#!/bin/sh\nexit 0\n')
  await chmod(join(dir, 'promtool'), 0o755)
  for (const CI of ['true', undefined]) {
    const tool = await externalTool('promtool', { PATH: dir, ...(CI === undefined ? {} : { CI }) })
    t.equal(tool.skip, false)
    const { t: fake, failures } = recorder()
    t.same(tool.require(fake), { file: 'promtool', prefix: [] })
    t.same(failures, [])
  }
})

t.test('several tools: skipped with the first missing one\'s reason; in CI each missing one fails', async t => {
  const dir = await mkdtemp(join(tmpdir(), 'mcpgw-tools-'))
  t.teardown(() => rm(dir, { recursive: true, force: true }))
  await writeFile(join(dir, 'redis-server'), '#!/bin/sh\nexit 0\n')
  await chmod(join(dir, 'redis-server'), 0o755)
  const laptop = await externalTools(['redis-server', 'redis-cli'], { PATH: dir })
  t.match(laptop.skip, /^SKIPPED: redis-cli is not installed \(Debian package redis-tools/)
  const ci = await externalTools(['redis-server', 'redis-cli', 'promtool'], { PATH: dir, CI: 'true' })
  t.equal(ci.skip, false)
  const { t: fake, failures } = recorder()
  t.equal(ci.present(fake), false)
  t.match(failures, [/^redis-cli is not installed/, /^promtool is not installed/])
  const present = await externalTools(['redis-server'], { PATH: dir })
  t.equal(present.skip, false)
  t.equal(present.present(recorder().t), true)
})

t.test('the README\'s table and the install script name every tool, and no other', async t => {
  const readme = await readFile(join(ROOT, 'README.md'), 'utf8')
  const header = readme.indexOf('| tool | enables | from |')
  t.ok(header >= 0, 'the README has the table')
  const rows = readme.slice(header).split('\n').slice(2)
  const table = rows.slice(0, rows.findIndex(row => !row.startsWith('|'))).map(row => row.split('|').map(cell => cell.trim()))
  const names = (cell: string): string[] => [...cell.matchAll(/`([^`]+)`/g)].map(m => m[1] as string)
  const specs = Object.entries(TOOLS)
  t.equal(table.length, specs.length, 'one row per tool')
  for (const [name, spec] of specs) {
    const commands = spec.candidates.map(c => [basename(c.command), ...c.prefix].join(' '))
    const row = table.find(cells => names(cells[1] ?? '').join() === commands.join())
    t.ok(row, `${name}: a row for ${commands.join(' or ')}`)
    t.match(row?.[3], `Debian \`${spec.debian}\``, `${name}: its Debian package`)
  }
  const script = await readFile(join(ROOT, 'scripts', 'install-packaging-tools.sh'), 'utf8')
  const installed = [...script.matchAll(/missing="\$missing ([^"]+)"/g)].map(m => m[1]).sort()
  t.same(installed, specs.map(([, spec]) => spec.debian).sort(), 'the install script installs each Debian package')
})
