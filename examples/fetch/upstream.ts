/**
 * An App running as its own service behind the proxy: the MCP SDK's web-standard transport,
 * one server per version at `/mcp/<version>`, and every request must carry the platform's
 * identity token (`X-MCP-Identity`), verified against the platform's JWKS.
 */
import { JwksUnavailableError, UnauthorizedError } from 'mcp-dispatch'
import { createIdentityVerifier } from 'mcp-dispatch/proxy'
import { type McpAppHandler, buildAppServer, createMcpAppHandler } from '../platform/mcp-app.js'

export interface UpstreamAppOptions {
  /** Where the platform publishes its JWKS. */
  jwks: string
  /** The platform's `iss`. */
  issuer: string
  /** This service's origin, the `aud` the platform signs for. */
  audience: string
}

export function createUpstreamApp(options: UpstreamAppOptions): {
  fetch: (request: Request) => Promise<Response>
  close(): Promise<void>
} {
  const verifyIdentity = createIdentityVerifier({ ...options, appId: 'app_weather' })
  const versions = new Map<string, McpAppHandler>()
  return {
    async fetch(request) {
      // A release or a pre-release (`/mcp/2.1.0-rc.1`): whichever the platform signed for.
      const match = /^\/mcp\/(\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?)$/.exec(new URL(request.url).pathname)
      if (!match) return new Response('Not found', { status: 404 })
      let identity
      try {
        identity = await verifyIdentity(request) // { subject, appId, version, … }: who is calling, at which version
      } catch (error) {
        if (error instanceof UnauthorizedError) return new Response('Unauthorized', { status: 401 })
        // The platform's JWKS could not be fetched: not the caller's fault, try again.
        if (error instanceof JwksUnavailableError) return new Response('Service unavailable', { status: 503 })
        throw error
      }
      const version = match[1]!
      // The platform decided the version: the path must name the one it signed (`ver`), so a
      // token minted for 1.0.0 serves 1.0.0 only (and no path makes a server of its own).
      if (identity.version !== version) return new Response('Version not signed for', { status: 403 })
      let handler = versions.get(version)
      if (!handler) {
        handler = createMcpAppHandler(() => buildAppServer({ slug: 'weather', name: 'Weather' }, version, { conformance: false }))
        versions.set(version, handler)
      }
      // The verified identity names the caller (subject, clientId, appId, version), whose
      // sessions are capped (`maxSessionsPerCaller`).
      return handler(request, identity)
    },
    close: async () => void (await Promise.all([...versions.values()].map((v) => v.close()))),
  }
}
