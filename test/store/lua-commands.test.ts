// The Redis store's Lua scripts as files (src/store/redis/commands/): each one
// loads, compiles in Redis, uses no more keys than its file name says, and
// runs on its own, outside the gateway (redis-cli --eval, EVAL).
import t from 'tap'
import { execFile } from 'node:child_process'
import { readdirSync } from 'node:fs'
import { promisify } from 'node:util'
import { COMMANDS, FENCED, loadLua, ROLLED_BACK, UNSPLIT } from '../../src/store/redis/lua.js'
import { useRedis } from '../fixtures/redis.js'
import { externalTools } from '../fixtures/external-tools.js'

const redisCli = await externalTools(['redis-cli'])

const run = promisify(execFile)
const DIR = new URL('../../src/store/redis/commands/', import.meta.url)

t.test('every file is a command, named with its key count', async t => {
  const files = readdirSync(DIR).filter(f => f.endsWith('.lua')).map(f => f.slice(0, -4)).sort()
  t.same(Object.values(COMMANDS).map(c => c.file).sort(), files, 'one command per file, none left out')
  for (const command of Object.values(COMMANDS)) {
    t.notMatch(command.lua, /--- @include/, `${command.file}: every include resolved`)
    const used = Math.max(0, ...[...command.lua.matchAll(/KEYS\[(\d+)\]/g)].map(m => Number(m[1])))
    if (command.numberOfKeys === undefined) {
      t.match(command.lua, /#KEYS|ipairs\(KEYS\)/, `${command.file}: a variable number of keys, all of them read`)
    } else {
      t.equal(used, command.numberOfKeys, `${command.file}: uses exactly the keys its name counts`)
    }
  }
  t.match(COMMANDS.append.lua, FENCED)
  t.match(COMMANDS.append.lua, ROLLED_BACK)
  t.match(COMMANDS.appendSplit.lua, UNSPLIT)
})

t.test('an include comes once, its own includes first', async t => {
  const lua = loadLua('read-plan-3')
  t.equal(lua.match(/local function countOf/g)?.length, 1, 'entry-seqs (included by read-rows) once')
  t.ok(lua.indexOf('local function countOf') < lua.indexOf('local function readRows'), 'before the part that needs it')
  t.ok(lua.indexOf('local function streamState') < lua.indexOf('local meta'), 'parts before the body')
})

t.test('each script compiles in Redis (SCRIPT LOAD)', async t => {
  const env = await useRedis(t, 'lua-load')
  for (const command of Object.values(COMMANDS)) {
    t.match(await env.redis.script('LOAD', command.lua), /^[0-9a-f]{40}$/, command.file)
  }
})

t.test('a script runs on its own: redis-cli --eval on the file', { skip: redisCli.skip }, async t => {
  if (!redisCli.present(t)) return
  const env = await useRedis(t, 'lua-cli')
  const { hostname, port } = new URL(env.url)
  const cli = async (file: string, keys: string[], args: string[]): Promise<string> =>
    (await run('redis-cli', ['-h', hostname, '-p', port || '6379', '--eval', new URL(`${file}.lua`, DIR).pathname, ...keys, ',', ...args])).stdout.trim()
  const mark = `${env.prefix}intact`
  t.equal(await cli('intact-1', [mark], ['1000']), '1000', 'intact-1: sets the mark when missing')
  t.equal(await cli('intact-1', [mark], ['2000']), '1000', 'and keeps it after')
  const meta = `${env.prefix}{s}:m`
  const lease = `${env.prefix}{s}:lease`
  t.equal(await cli('lease-acquire-2', [lease, meta], ['tok', '5000', '_']), '-1', 'lease-acquire-2: no session, no lease')
  await env.redis.hset(meta, 'epoch', 'e1')
  t.equal(await cli('lease-acquire-2', [lease, meta], ['tok', '5000', '_']), '1\n0', 'taken, by a first holder')
  t.equal(await env.redis.get(lease), 'tok')
})

t.test('a script with includes runs by EVAL of its loaded text', async t => {
  const env = await useRedis(t, 'lua-eval')
  const tag = `${env.prefix}{s}`
  await env.redis.hset(`${tag}:m`, 'epoch', 'e1', 'principal', 'p')
  t.same(await env.redis.eval(COMMANDS.open.lua, 2, `${tag}:m`, `${tag}:b:x`, 'x', 60_000), ['e1', 0, 1, 0], 'open-2: a new stream')
  const appended = await env.redis.eval(COMMANDS.append.lua, 5, `${tag}:m`, `${tag}:b:x`, `${tag}:lease`, `${tag}:z:x`, `${tag}:aud`,
    'x', 100, 1_000_000, 60_000, '0', `${tag}:n`, 'r1', '', -1, '', '', 's', '', 1, 1, '0 5 0 0 ', 'hello')
  t.same(appended, ['e1', 0, 0, 0], 'append-5: one event after seq 0')
  const read = await env.redis.eval(COMMANDS.read.lua, 2, `${tag}:m`, `${tag}:b:x`, 'x', 0, 10, 1_000_000) as unknown[]
  t.same(read.slice(0, 4), ['e1', 1, 1, 0], 'read-2: its state')
  t.same((read[4] as Array<[string, string[]]>)[0], ['1-1', ['s', '5', 'l', '0 5 0 0 ', 'b', 'hello']], 'and its entry')
})
