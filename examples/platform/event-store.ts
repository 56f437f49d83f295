/**
 * The event store of one MCP session, in memory: what makes its SSE streams resumable. A client
 * whose stream ended (the network, or the server closing it to make the client poll, SEP-1699)
 * reconnects with `GET` and `Last-Event-ID`, and gets what was sent on that stream after it.
 */
import type { EventId, EventStore, StreamId } from '@modelcontextprotocol/sdk/server/webStandardStreamableHttp.js'
import type { JSONRPCMessage } from '@modelcontextprotocol/sdk/types.js'

/** Options of {@link createSessionEventStore}. */
export interface SessionEventStoreOptions {
  /** The session keeps its last this many events; older ones can no longer be resumed from. Default 1,000. */
  maxEvents?: number
  /**
   * ...and at most this many characters of them (their JSON), oldest dropped first. Default
   * 1,000,000: without it, 1,000 answers of a tool that echoes 10,000 characters held about
   * 21 MB per session. An event larger than this on its own is not kept: only its place, so a
   * stream can still resume after it, and nothing before it (a resumption from there could
   * not give it back). Kept whole, it let a client make each session hold what it asked for
   * (a tool name of 4 MB, echoed in the error).
   */
  maxChars?: number
}

/** Creates the event store of one session (give each transport its own). */
export function createSessionEventStore(options: SessionEventStoreOptions = {}): EventStore {
  const maxEvents = options.maxEvents ?? 1_000
  const maxChars = options.maxChars ?? 1_000_000
  // Insertion order is the order events were sent in.
  // `message` undefined: the place of an event too large to keep (always the oldest entry).
  const events = new Map<EventId, { streamId: StreamId; message: JSONRPCMessage | undefined; chars: number }>()
  let chars = 0
  let sequence = 0
  return {
    async storeEvent(streamId, message) {
      const id = String(++sequence)
      const size = JSON.stringify(message).length
      if (size > maxChars) {
        events.clear()
        chars = 0
        events.set(id, { streamId, message: undefined, chars: 0 })
        return id
      }
      events.set(id, { streamId, message, chars: size })
      chars += size
      while (events.size > 1 && (events.size > maxEvents || chars > maxChars)) {
        const [oldest, event] = events.entries().next().value!
        events.delete(oldest)
        chars -= event.chars
      }
      return id
    },
    async getStreamIdForEventId(eventId) {
      return events.get(eventId)?.streamId
    },
    async replayEventsAfter(lastEventId, { send }) {
      const last = events.get(lastEventId)
      if (!last) throw new Error(`Unknown event id ${lastEventId}`)
      let after = false
      for (const [id, event] of events) {
        // A priming event (the first of a stream, with no data) carries no message to replay.
        if (after && event.streamId === last.streamId && event.message && 'jsonrpc' in event.message) await send(id, event.message)
        if (id === lastEventId) after = true
      }
      return last.streamId
    },
  }
}
