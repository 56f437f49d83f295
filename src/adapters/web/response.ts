/**
 * A dispatch-layer reply as a web `Response` (not an entry point: `mcp-dispatch/web` exports it).
 * @module
 */
import type { Reply } from '../../core/reply.js'

/**
 * Writes a dispatch-layer {@link Reply} as a `Response`, byte for byte as the adapters send it:
 * for answers of your own in the dispatch layer's form (`sessionNotFoundReply()` of an MCP
 * handler that lost a session, `invalidHostReply()` of a server that could not parse a `Host`).
 *
 * @example
 * ```ts
 * import { sessionNotFoundReply } from 'mcp-dispatch'
 * import { toResponse } from 'mcp-dispatch/web'
 *
 * return transport ? transport.handleRequest(request) : toResponse(sessionNotFoundReply())
 * ```
 */
export function toResponse(reply: Reply): Response {
  return new Response(reply.body, { status: reply.status, headers: reply.headers })
}
