// What the first of an event's four layout numbers says about it (see
// EventBatch): the stores and the client stream read packed events by these.

/** Layout flags of an event in a batch: it has an event type. */
export const FLAG_EVENT = 1
/** ... it has an upstream id (possibly empty). */
export const FLAG_UPSTREAM_ID = 2
/** ... it is an upstream frame rather than text data. */
export const FLAG_FRAME = 4
