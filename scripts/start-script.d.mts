// Types for start-script.mjs, so TypeScript tests can import it.
export interface StartScript {
  readonly env: Record<string, string>
  readonly flags: string[]
  readonly main: string
}
export declare function parseStartScript (script: string): StartScript
export declare function readStartScript (path: string): StartScript
