/**
 * A Web-standard `fetch` on Node, as the Hono and fetch examples serve it: `@hono/node-server`'s
 * request listener on a `node:http` server, with the `errorHandler` of docs/adapters.md, so a
 * request it cannot build a `Request` of (a `Host` no URL can hold, a target that is no path)
 * gets a JSON-RPC answer as on the Express and Fastify adapters, not an empty 400;
 * `answerClientError` for what Node's parser refuses (a malformed request, a head past 16 KiB);
 * and `createNodeServer`'s answers to what Node refuses itself (no `Host`, an `Expect`).
 */
import type { Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { RequestError, getRequestListener } from '@hono/node-server'
import { invalidHostReply, notFoundReply, serviceUnavailableReply } from 'mcp-dispatch'
import { answerClientError, toResponse } from 'mcp-dispatch/web'
import { createNodeServer } from './demo.js'

/**
 * Whether `@hono/node-server` refused a request for its target rather than its `Host`: a
 * backslash in the path, an absolute-form target refused for one (`http://host/v1\x`), an
 * "Invalid URL" with no cause (a target that is no path), or one from the URL parser whose input
 * holds no `/` after its `scheme://` (a target that is no path, `OPTIONS *`, behind a `Host` the
 * parser had to read: `weather.example.com:80`). The rest is the Host's fault: an "Invalid URL"
 * from the URL parser of `scheme://host/path`, an invalid host header, an absolute-form target
 * whose host no URL holds. (`OPTIONS *` behind an upper-case `Host` is reported as an invalid
 * host header, which tells nothing of the target: the Host's 400.)
 */
export function targetAtFault(error: RequestError): boolean {
  const cause = error.cause
  switch (error.message) {
    case 'Backslash in request path':
      return true
    case 'Invalid absolute URL':
      return cause instanceof RequestError && cause.message === 'Backslash in request path'
    case 'Invalid URL': {
      if (cause === undefined) return true
      const input = (cause as { input?: unknown }).input
      return typeof input === 'string' && !input.slice(input.indexOf('//') + 2).includes('/')
    }
    default:
      return false
  }
}

/** What `@hono/node-server` hands `fetch` beside the request on Node. */
export type NodeEnv = { incoming?: { socket?: { remoteAddress?: string } }; outgoing?: unknown }

/** Listens on `hostname:port` (0: any free port); resolves with the server and its port. */
export async function serveNode(
  fetch: (request: Request, env: NodeEnv) => Response | Promise<Response>,
  options: { port: number; hostname: string },
): Promise<{ server: Server; port: number }> {
  const listener = getRequestListener(fetch, {
    hostname: options.hostname,
    // The host of an HTTP/1.0 request without `Host` (the demo serves its App at any host); an
    // HTTP/1.1 one is refused before this, by `createNodeServer`'s 400.
    errorHandler: (error) => {
      if (!(error instanceof RequestError)) return toResponse(serviceUnavailableReply())
      return toResponse(targetAtFault(error) ? notFoundReply() : invalidHostReply())
    },
  })
  const server = createNodeServer(listener)
  server.on('clientError', answerClientError)
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject)
    server.listen(options.port, options.hostname, () => resolve())
  })
  return { server, port: (server.address() as AddressInfo).port }
}
