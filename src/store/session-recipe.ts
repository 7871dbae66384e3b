/**
 * The recipe's compaction, for a store that keeps it in this process (the
 * Redis store does the same in Lua, session-state-1.lua): the last log level
 * replaces the one before; subscriptions are a set, bounded by SUBSCRIPTIONS_MAX;
 * state the recipe cannot follow marks it incomplete.
 */
import { SUBSCRIPTIONS_MAX, type SessionRecipe, type SessionStateChange } from './contract.js'

export function applyStateChange (recipe: SessionRecipe, change: SessionStateChange): SessionRecipe {
  switch (change.kind) {
    case 'log_level':
      return { ...recipe, logLevel: change.request }
    case 'untracked':
      return { ...recipe, complete: false }
    case 'unsubscribe':
      return { ...recipe, subscriptions: recipe.subscriptions.filter(uri => uri !== change.uri) }
    case 'subscribe': {
      if (!recipe.complete || recipe.subscriptions.includes(change.uri)) return recipe
      const subscriptions = [...recipe.subscriptions, change.uri]
      if (subscriptions.length > SUBSCRIPTIONS_MAX.count || subscriptionBytes(subscriptions) > SUBSCRIPTIONS_MAX.bytes) {
        return { ...recipe, complete: false }
      }
      return { ...recipe, subscriptions }
    }
  }
}

/** The bytes the bound counts: each URI's UTF-8 bytes. */
export function subscriptionBytes (uris: readonly string[]): number {
  let bytes = 0
  for (const uri of uris) bytes += Buffer.byteLength(uri)
  return bytes
}

/** What a recipe holds, in bytes (the embedded store counts it against its cap). */
export function recipeBytes (recipe: SessionRecipe): number {
  return Buffer.byteLength(recipe.initialize) + Buffer.byteLength(recipe.initializeResult) +
    (recipe.logLevel === undefined ? 0 : Buffer.byteLength(recipe.logLevel)) + subscriptionBytes(recipe.subscriptions)
}
