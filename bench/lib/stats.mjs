// Small statistics helpers.

export function median (values) {
  const v = values.filter(x => Number.isFinite(x)).sort((a, b) => a - b)
  if (v.length === 0) return NaN
  const mid = v.length >> 1
  return v.length % 2 === 1 ? v[mid] : (v[mid - 1] + v[mid]) / 2
}

/** Nearest-rank percentile of an unsorted numeric array (p in 0..100). */
export function percentile (values, p) {
  if (values.length === 0) return NaN
  const sorted = Float64Array.from(values).sort()
  const rank = Math.min(sorted.length - 1, Math.max(0, Math.ceil(p / 100 * sorted.length) - 1))
  return sorted[rank]
}

export function summarize (values) {
  if (values.length === 0) return { n: 0, p50: NaN, p99: NaN, max: NaN }
  const sorted = Float64Array.from(values).sort()
  const at = p => sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(p / 100 * sorted.length) - 1))]
  return { n: sorted.length, p50: at(50), p99: at(99), max: sorted[sorted.length - 1] }
}

/** Run `fn` over `items` with at most `limit` in flight. */
export async function mapLimit (items, limit, fn) {
  const out = new Array(items.length)
  let next = 0
  const worker = async () => {
    while (next < items.length) {
      const i = next++
      out[i] = await fn(items[i], i)
    }
  }
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker))
  return out
}

/** Like mapLimit but keeps going on errors: [{ ok, value | error }]. */
export async function mapSettled (items, limit, fn) {
  return await mapLimit(items, limit, async (item, i) => {
    try { return { ok: true, value: await fn(item, i) } } catch (error) { return { ok: false, error } }
  })
}
