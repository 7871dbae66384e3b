// The official MCP conformance suite (server scenarios, stable release and
// newest prerelease) through the gateway, compared with the same SDK server
// reached directly WITH its event store: every scenario that passes there must
// pass through the gateway in front of the server WITHOUT a store, on the
// embedded store and on Redis. What does not is listed below with its cause,
// and the failing set must equal that list exactly: a fix fails this test until
// its entry is removed, so the list never goes stale.
//
// "Passes" means no failed check and no warning the baseline does not give too
// (warnings are how the suite reports a lost resumption, for example).
// Anything unexpected is tried twice more, and a flake is reported as one.
// Run alone: npx tap --disable-coverage test/interop/conformance.test.ts
// (CONFORMANCE_JSON=file.json keeps the full results; see also scripts/conformance.mjs).
import t from 'tap'
import { writeFile } from 'node:fs/promises'
import {
  defaultPlan,
  EXTRA_SETUPS,
  formatTable,
  retryCells,
  runMatrix,
  SETUPS,
  SUITE_VERSIONS,
  toJson,
  type CellRef,
  type ScenarioRun,
  type SetupName,
  type SuiteVersion,
  type VersionResult
} from '../fixtures/conformance-runner.js'

type GatewaySetup = Exclude<SetupName, 'direct-store' | 'direct'>

interface KnownFailure {
  readonly reason: string
  readonly setups: readonly GatewaySetup[]
  /** Default: every suite version. */
  readonly versions?: readonly SuiteVersion[]
  /**
   * Lost in a race, so some tries pass: no cell of it is asserted alone, but the
   * race must show in at least one try of all its cells together.
   */
  readonly race?: true
}

const STORE_LESS: GatewaySetup[] = ['gateway-memory', 'gateway-redis']

/**
 * Scenario -> why it fails through the gateway today, and where. Empty: every
 * scenario that passes directly with a store passes through the gateway.
 */
const KNOWN_GATEWAY_FAILURES: Record<string, KnownFailure> = {}

/** Scenario -> why it fails directly against the server with its store too (excluded from the comparison). */
const BASELINE_FAILURES: Record<string, string> = {}

/** The SEP-1699 scenario is all that changes with a resumable upstream. */
const PLAN = [
  ...defaultPlan(SUITE_VERSIONS, SETUPS),
  ...SUITE_VERSIONS.flatMap((version) => EXTRA_SETUPS.map((setup) => ({ version, setup, scenarios: ['server-sse-polling'] })))
]
const GATEWAY_SETUPS: GatewaySetup[] = [...STORE_LESS, ...EXTRA_SETUPS]
const RETRIES = 2

t.setTimeout(600_000)

function known (scenario: string, version: SuiteVersion, setup: GatewaySetup): KnownFailure | undefined {
  const entry = KNOWN_GATEWAY_FAILURES[scenario]
  if (entry === undefined || !entry.setups.includes(setup) || !(entry.versions ?? SUITE_VERSIONS).includes(version)) return undefined
  return entry
}

t.test('every scenario that passes directly with a store passes through the gateway without one', async (t) => {
  const started = Date.now()
  const progress = (message: string): void => { t.comment(`[${((Date.now() - started) / 1000).toFixed(0)} s] ${message}`) }
  const options = { concurrency: 4, onProgress: progress }
  const results = await runMatrix(PLAN, options)
  const resultOf = (version: SuiteVersion): VersionResult => results.find((r) => r.version === version) as VersionResult
  const tries = (version: SuiteVersion, setup: SetupName, scenario: string): ScenarioRun[] => resultOf(version).cells.get(setup)?.get(scenario)?.tries ?? []

  const baselineFails = (version: SuiteVersion, scenario: string): boolean => tries(version, 'direct-store', scenario).some((run) => !run.passed)
  // A try regresses when it fails, or warns where the baseline does not: these are its checks that do.
  const regressions = (version: SuiteVersion, scenario: string, run: ScenarioRun): string[] => {
    const tolerated = new Set(tries(version, 'direct-store', scenario).flatMap((r) => r.warnings.map((w) => w.check)))
    return [
      ...run.failures.map((p) => `FAIL ${p.check}: ${p.message}`),
      ...run.warnings.filter((w) => !tolerated.has(w.check)).map((p) => `warn ${p.check}: ${p.message}`)
    ]
  }
  const regressed = (version: SuiteVersion, scenario: string, run: ScenarioRun): boolean => regressions(version, scenario, run).length > 0
  const failing = (version: SuiteVersion, setup: GatewaySetup, scenario: string): boolean => tries(version, setup, scenario).some((run) => regressed(version, scenario, run))
  /** What the regressed tries of a cell reported, for the assertion's message. */
  const reported = (version: SuiteVersion, setup: GatewaySetup, scenario: string): string => {
    const all = tries(version, setup, scenario)
    return all.flatMap((run, i) => {
      const found = regressions(version, scenario, run)
      return found.length > 0 ? [`try ${i + 1} of ${all.length}: ${found.join(' | ')}`] : []
    }).join(' / ')
  }
  const gatewayCells = (): Array<CellRef & { setup: GatewaySetup }> => SUITE_VERSIONS.flatMap((version) => GATEWAY_SETUPS.flatMap((setup) =>
    [...(resultOf(version).cells.get(setup)?.keys() ?? [])].map((scenario) => ({ version, setup, scenario }))))
  const unexpected = (ref: CellRef & { setup: GatewaySetup }): boolean => {
    const entry = known(ref.scenario, ref.version, ref.setup)
    if (BASELINE_FAILURES[ref.scenario] !== undefined || entry?.race === true) return false
    return failing(ref.version, ref.setup, ref.scenario) !== (entry !== undefined)
  }

  // Whatever disagrees with the lists is tried again, so that a flake shows as one.
  const recheck: CellRef[] = [
    ...SUITE_VERSIONS.flatMap((version) => resultOf(version).scenarios
      .filter((scenario) => baselineFails(version, scenario) !== (BASELINE_FAILURES[scenario] !== undefined))
      .map((scenario) => ({ version, setup: 'direct-store' as const, scenario }))),
    ...gatewayCells().filter(unexpected)
  ]
  if (recheck.length > 0) await retryCells(results, recheck, RETRIES, options)
  // A race that did not show yet gets more tries where it shows most (Redis).
  const raceCells = gatewayCells().filter((ref) => known(ref.scenario, ref.version, ref.setup)?.race === true)
  const raceShows = (): boolean => raceCells.some((ref) => failing(ref.version, ref.setup, ref.scenario))
  if (raceCells.length > 0 && !raceShows()) await retryCells(results, raceCells.filter((ref) => ref.setup === 'gateway-redis'), RETRIES, options)

  t.comment(formatTable(results))
  const elapsed = (Date.now() - started) / 1000
  t.comment(`wall time ${elapsed.toFixed(1)} s`)
  if (process.env.CONFORMANCE_JSON !== undefined) await writeFile(process.env.CONFORMANCE_JSON, JSON.stringify(toJson(results), null, 2) + '\n')

  for (const version of SUITE_VERSIONS) {
    const scenarios = resultOf(version).scenarios
    t.ok(scenarios.length >= 30, `${version}: the suite ran its scenarios (${scenarios.length})`)
    t.strictSame(scenarios.filter((s) => baselineFails(version, s)), scenarios.filter((s) => BASELINE_FAILURES[s] !== undefined),
      `${version}: what fails directly with the store is what BASELINE_FAILURES lists`)
    for (const setup of GATEWAY_SETUPS) {
      const ran = [...(resultOf(version).cells.get(setup)?.keys() ?? [])].filter((s) => BASELINE_FAILURES[s] === undefined && known(s, version, setup)?.race !== true)
      const failed = ran.filter((s) => failing(version, setup, s))
      const listed = ran.filter((s) => known(s, version, setup) !== undefined)
      // A CI log may keep only the failures' tail: the message itself says what the unlisted ones reported.
      const unlisted = failed.filter((s) => !listed.includes(s)).map((s) => `${s}: ${reported(version, setup, s)}`)
      t.strictSame(failed, listed,
        `${version} ${setup}: what fails through the gateway is what KNOWN_GATEWAY_FAILURES lists (a fixed scenario must leave the list)` +
        (unlisted.length > 0 ? `; unlisted: ${unlisted.join('; ')}` : ''))
    }
  }
  if (raceCells.length > 0) {
    t.ok(raceShows(), `the late upstream GET race shows in at least one of ${raceCells.length} cells (none failing: it is fixed, remove its entries)`)
  }
})
