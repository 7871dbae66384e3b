// Checks that need a tool npm does not install: skipped with their reason on a
// laptop, mandatory (run, and failed) in CI.
import t from 'tap'
import type { Test } from 'tap'
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { externalTool } from '../fixtures/external-tools.js'

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
