/**
 * Every request at every path (`/`, `/v1`, `/.well-known/oauth-protected-resource`…) through
 * the dispatch layer: the wiring docs/adapters.md ("Next.js") shows.
 */
import { platform } from '../../lib/platform'

async function route(request: Request): Promise<Response> {
  const { handle } = await platform
  // Next.js builds request.url of its own address: the Host names the App. Next adds
  // X-Forwarded-For only where the client sent none, so only its last hop, which the proxy in
  // front appends, is the client's (and only where Next.js is reachable through it alone).
  const forwardedFor = request.headers.get('x-forwarded-for')
  return handle(request, {
    host: request.headers.get('host'),
    clientAddress: forwardedFor?.slice(forwardedFor.lastIndexOf(',') + 1).trim(),
  })
}

// PUT and PATCH too, so that they get the dispatch layer's 405 (JSON-RPC, with Allow), not Next's bare one.
export { route as GET, route as POST, route as DELETE, route as OPTIONS, route as PUT, route as PATCH }
