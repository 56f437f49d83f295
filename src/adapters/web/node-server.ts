/**
 * The Web adapter on Node through `@hono/node-server` (2.x): what to answer a request its
 * listener cannot make a web `Request` of, which it answers with an empty 400 of its own unless
 * given an `errorHandler`. No import of `@hono/node-server`: its `RequestError` is known by its
 * name and messages. Not an entry point: `mcp-dispatch/web` exports it.
 * @module
 */
import { invalidHostReply, notFoundReply, serviceUnavailableReply } from '../../core/reply.js'
import { toResponse } from './response.js'

/**
 * What `@hono/node-server` could not make a `Request` of: the `Host` (`weather.example.com:99999`,
 * `a@weather.example.com`, one the URL parser rewrites), no `Host` at all (and no `hostname`
 * option to fall back on), or the request target (a backslash in its path, `OPTIONS *`).
 */
export type NodeServerFault = 'host' | 'no-host' | 'target'

/**
 * Which part of a request `@hono/node-server` refused, read from the `RequestError` its
 * listener hands the `errorHandler` (by the messages of its 2.x line); `undefined` for any other
 * error (the fetch handler's own rejection, a message it does not know). A backslash in the
 * path (an absolute-form target's too), an "Invalid URL" that is no path (with no cause, or from
 * the URL parser of an input holding no `/` after `scheme://`: `OPTIONS *` behind
 * `Host: weather.example.com:80`), and over HTTP/2 an absolute-form `:path` or a `:scheme` other
 * than `http` and `https` are the target's; an invalid host header, a `scheme://host/path` the
 * URL parser refuses and an absolute-form target whose host no URL holds are the Host's
 * (`OPTIONS *` behind an upper-case `Host` is reported as an invalid host header, which tells
 * nothing of the target).
 *
 * @example
 * ```ts
 * import { getRequestListener } from '@hono/node-server'
 * import { jsonRpcErrorReply } from 'mcp-dispatch'
 * import { nodeServerErrorHandler, nodeServerFault, toResponse } from 'mcp-dispatch/web'
 *
 * // A 400 naming the target, where nodeServerErrorHandler answers the dispatch layer's 404.
 * const listener = getRequestListener(app.fetch, {
 *   errorHandler: (error) =>
 *     nodeServerFault(error) === 'target'
 *       ? toResponse(jsonRpcErrorReply(400, { code: -32600, message: 'Invalid request target' }))
 *       : nodeServerErrorHandler(error),
 * })
 * ```
 */
export function nodeServerFault(error: unknown): NodeServerFault | undefined {
  if (!(error instanceof Error) || error.name !== 'RequestError') return undefined
  const cause: unknown = error.cause
  switch (error.message) {
    case 'Missing host header':
      return 'no-host'
    case 'Invalid host header':
      return 'host'
    case 'Backslash in request path':
    case 'Absolute URL for :path is not allowed in HTTP/2':
    case 'Unsupported scheme':
      return 'target'
    case 'Invalid absolute URL':
      return cause instanceof Error && cause.message === 'Backslash in request path' ? 'target' : 'host'
    case 'Invalid URL': {
      if (cause === undefined) return 'target'
      const input = (cause as { input?: unknown } | null)?.input
      return typeof input === 'string' && !input.slice(input.indexOf('//') + 2).includes('/') ? 'target' : 'host'
    }
    default:
      return undefined
  }
}

/**
 * The `errorHandler` for `@hono/node-server`'s `getRequestListener`: a request it cannot make a
 * `Request` of gets the answer the Express and Fastify adapters give the same request, instead
 * of an empty 400. A `Host` the URL parser refuses or rewrites is 400 `Invalid Host header`
 * (`field: 'host'`); a target that is no path or has a backslash in it, and a request without
 * `Host` (HTTP/1.0, with no `hostname` option to fall back on), are 404 `not_found`: they name
 * no App. Any other error (a fetch handler that rejected: the Web adapter's never does; a
 * refusal {@link nodeServerFault} does not know) is 503 `temporarily_unavailable`. These
 * answers are built without the dispatcher, which never saw the request: no `Vary: Origin`, no
 * CORS headers. `serve()` of `@hono/node-server` takes no `errorHandler`: build the listener
 * and the server yourself.
 *
 * @example
 * ```ts
 * import { createServer } from 'node:http'
 * import { getRequestListener } from '@hono/node-server'
 * import { answerClientError, nodeServerErrorHandler } from 'mcp-dispatch/web'
 *
 * const server = createServer(getRequestListener(app.fetch, { errorHandler: nodeServerErrorHandler }))
 * server.on('clientError', answerClientError) // what Node's own parser refuses
 * server.listen(8787)
 * ```
 */
export function nodeServerErrorHandler(error: unknown): Response {
  const fault = nodeServerFault(error)
  if (fault === undefined) return toResponse(serviceUnavailableReply())
  return toResponse(fault === 'host' ? invalidHostReply() : notFoundReply())
}
