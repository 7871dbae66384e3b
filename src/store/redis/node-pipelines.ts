/**
 * Commands of many sessions on a Cluster, in explicit pipelines of bounded
 * size, one or more per node, all written in the turn they are made.
 *
 * Auto-pipelining sends what a turn issues to a node as one pipeline, and
 * ioredis writes a pipeline as one string: past about a thousand sessions a
 * node (a lease tick, an audience refresh), that string lands in V8's
 * large-object space, garbage that only a full collection frees, so an idle
 * replica's heap grew by it at every tick. Pipelines sent one after another
 * would bound it too, but a slow node would then hold back every session
 * behind it; these all go out at once.
 */
import type { Cluster } from 'ioredis'
import calculateSlot from 'cluster-key-slot'
import type { StoreCommands } from './lua.js'

/** Commands in one pipeline at most: about 80 KB of lease renewals, well below V8's large objects. */
export const PIPELINE_COMMANDS = 256

/** A Cluster pipeline with the store's scripts as commands. */
export type NodePipeline = ReturnType<Cluster['pipeline']> & StoreCommands

/** One command's reply in a pipeline: its error, or null and the reply. */
export type PipelineReply = [Error | null, unknown]

/**
 * Each item's `perItem` commands (`add`, keys of the one slot of `keyOf`),
 * grouped as ioredis checks a pipeline (the nodes serving each key's slot,
 * Cluster.slots), at most PIPELINE_COMMANDS to a pipeline. Resolves to each
 * item's replies, in order: those of a pipeline that failed as a whole (the
 * Cluster not ready, or its slots moved since they were grouped) are its error.
 */
export async function inNodePipelines<T> (cluster: Cluster & StoreCommands, items: readonly T[], perItem: number, keyOf: (item: T) => string, add: (pipeline: NodePipeline, item: T) => void): Promise<PipelineReply[][]> {
  const groups = new Map<string, number[]>()
  items.forEach((item, i) => {
    const group = cluster.slots[calculateSlot(keyOf(item))]?.join(';') ?? ''
    const members = groups.get(group)
    if (members === undefined) groups.set(group, [i])
    else members.push(i)
  })
  const perPipeline = Math.max(1, Math.floor(PIPELINE_COMMANDS / perItem))
  const replies: PipelineReply[][] = new Array(items.length)
  const sent: Array<Promise<void>> = []
  for (const members of groups.values()) {
    for (let at = 0; at < members.length; at += perPipeline) {
      const lot = members.slice(at, at + perPipeline)
      const pipeline = cluster.pipeline() as NodePipeline
      for (const i of lot) add(pipeline, items[i] as T)
      sent.push(pipeline.exec().then((got) => {
        lot.forEach((i, j) => { replies[i] = (got ?? []).slice(j * perItem, (j + 1) * perItem) as PipelineReply[] })
      }, (err: Error) => {
        for (const i of lot) replies[i] = [[err, undefined]]
      }))
    }
  }
  await Promise.all(sent)
  return replies
}

/** A command's reply, or its error thrown. */
export function replyOf (entry: PipelineReply | undefined): unknown {
  if (entry === undefined) throw new Error('no reply in the pipeline\'s answer')
  const [err, reply] = entry
  if (err !== null) throw err
  return reply
}
