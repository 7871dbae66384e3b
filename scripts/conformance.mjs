#!/usr/bin/env node
// The official MCP conformance suite's server scenarios, side by side: directly
// against a store-less SDK server (with and without the SDK's event store) and
// through the gateway on its embedded store and on Redis. Prints a table.
//
// Usage: node scripts/conformance.mjs [--versions=0.1.16,0.2.0-alpha.12]
//          [--setups=direct-store,direct,gateway-memory,gateway-redis,gateway-memory-upstream-store,gateway-redis-upstream-store]
//          [--scenarios=a,b (default: the suite's active set, then json-schema-2020-12, server-sse-polling)]
//          [--concurrency=4] [--retries=2] [--json=results.json]
// Redis: TEST_REDIS_URL (default redis://127.0.0.1:6379), a private key prefix
// whose keys are deleted at the end. The suite runs through npx on the
// npm-packaged Node 24 (it needs Node 22 or later); CONFORMANCE_LOG_LEVEL=debug
// shows the gateway's log.
//
// The runner is TypeScript next to the tests (test/fixtures/conformance-*.ts):
// this starts it with the loader tap uses for them.
import { spawn } from 'node:child_process'
import { createRequire } from 'node:module'
import { fileURLToPath, pathToFileURL } from 'node:url'

const root = fileURLToPath(new URL('..', import.meta.url))
// tap -> @tapjs/typescript -> its ts-node, resolved the way each package resolves its own dependency.
const fromTap = createRequire(createRequire(import.meta.url).resolve('tap/package.json'))
const fromPlugin = createRequire(fromTap.resolve('@tapjs/typescript/package.json'))
const loader = pathToFileURL(fromPlugin.resolve('@isaacs/ts-node-temp-fork-for-pr-2009/import')).href
const child = spawn(process.execPath, ['--import', loader, fileURLToPath(new URL('../test/fixtures/conformance-cli.ts', import.meta.url)), ...process.argv.slice(2)], {
  cwd: root,
  stdio: 'inherit',
  env: { ...process.env, TS_NODE_TRANSPILE_ONLY: '1', TS_NODE_PROJECT: fileURLToPath(new URL('../tsconfig.json', import.meta.url)) }
})
child.on('exit', (code, signal) => { process.exitCode = code ?? (signal === null ? 1 : 128) })
