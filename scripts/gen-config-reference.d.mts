// Types for gen-config-reference.mjs, so TypeScript tests can import it.
export declare const REFERENCE_PATH: string
export interface JsonSchemaProperty {
  type?: unknown
  default?: unknown
  description?: string
  minimum?: number
  maximum?: number
  enum?: unknown[]
  anyOf?: Array<{ const?: unknown }>
}
export declare function formatDefault (name: string, property: JsonSchemaProperty, required: readonly string[]): string
export declare function formatType (property: JsonSchemaProperty): string
export declare function renderConfigReference (schema: { properties: Record<string, JsonSchemaProperty>, required?: string[] }): string
