/** The Redis Cluster hash slot of a key (its hash tag's, when it has one). */
declare module 'cluster-key-slot' {
  function calculateSlot (key: string | Buffer): number
  export default calculateSlot
}
