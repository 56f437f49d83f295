import type { createDispatcher } from 'mcp-dispatch'
import { dispatchRequest } from '../helpers/dispatch-request.js'

/** A response as `complete` is told of it: ended by `end()` (the client) or by the dispatcher's `close`. */
export function openResponse() {
  const listeners: Array<() => void> = []
  let closedBy: 'client' | 'dispatcher' | undefined
  const end = (by: 'client' | 'dispatcher') => {
    if (closedBy) return
    closedBy = by
    for (const listener of listeners) listener()
  }
  return {
    whenClosed: (listener: () => void) => void listeners.push(listener),
    close: () => end('dispatcher'),
    end: () => end('client'),
    closedBy: () => closedBy,
  }
}

/** A session's GET stream opened with `token`, as an adapter of its own would drive the dispatcher. */
export async function openWith(
  dispatcher: ReturnType<typeof createDispatcher>,
  token: string,
  sessionId: string,
  clientAddress = '203.0.113.7',
) {
  const request = { ...dispatchRequest('/', { authorization: `Bearer ${token}`, 'mcp-session-id': sessionId }), method: 'GET', clientAddress }
  const decision = await dispatcher.decide(request)
  if (decision.type !== 'dispatch') throw new Error(`refused: ${decision.reply.status}`)
  const response = openResponse()
  decision.complete({ status: 200, sessionId: null, whenClosed: response.whenClosed, close: response.close })
  return response
}
