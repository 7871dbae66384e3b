import { ConfigSchema, type RawConfig } from './schema.js'

/**
 * How a variable of the schema becomes a field of the configuration, by its
 * name alone: camelCase, and a duration in seconds becomes milliseconds
 * (UPSTREAM_RESOLVE_SECONDS: upstreamResolveMs, times 1000; LEASE_TTL_MS:
 * leaseTtlMs as it is). The type and the function below follow the same rule.
 */
type Words<S extends string> = S extends `${infer Head}_${infer Tail}` ? `${Capitalize<Lowercase<Head>>}${Words<Tail>}` : Capitalize<Lowercase<S>>
export type FieldName<S extends string> = S extends `${infer Name}_SECONDS` ? Uncapitalize<`${Words<Name>}Ms`> : Uncapitalize<Words<S>>

export function fieldName (variable: string): string {
  const seconds = variable.endsWith('_SECONDS')
  const [first = '', ...rest] = (seconds ? variable.slice(0, -'_SECONDS'.length) : variable).toLowerCase().split('_')
  return first + rest.map(word => word.charAt(0).toUpperCase() + word.slice(1)).join('') + (seconds ? 'Ms' : '')
}

/**
 * Variables read only as part of a group (config.retention, config.jwt,
 * config.upstreamResumes, config.redisSentinel), built in load.ts: no field
 * of their own. The type and the pattern name the same prefixes.
 */
type Grouped = `RETENTION_${string}` | `AUTH_${string}` | `UPSTREAM_RESUME${string}` | `REDIS_SENTINEL${string}`
const GROUPED = /^(RETENTION_|AUTH_|UPSTREAM_RESUME|REDIS_SENTINEL)/

export function isGrouped (variable: string): boolean {
  return GROUPED.test(variable)
}

/** Every variable outside a group, as its field. */
export type PlainFields = { readonly [K in Exclude<keyof RawConfig, Grouped> as FieldName<K>]: RawConfig[K] }

export function plainFields (raw: RawConfig): PlainFields {
  const fields: Record<string, unknown> = {}
  for (const variable of Object.keys(ConfigSchema.properties)) {
    if (isGrouped(variable)) continue
    const value = raw[variable as keyof RawConfig]
    fields[fieldName(variable)] = variable.endsWith('_SECONDS') && value !== undefined ? (value as number) * 1000 : value
  }
  return fields as PlainFields
}
