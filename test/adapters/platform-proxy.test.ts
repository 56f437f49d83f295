/**
 * The reference platform serves versions seeded as `{ version, upstream }` through the proxy
 * handler: the App runs as its own service, receives the caller as a JWT verifiable against the
 * platform's JWKS (published at `api.{domain}/.well-known/jwks.json`), never the caller's token.
 */
import * as http from 'node:http'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import express from 'express'
import { type VerifiedIdentity, createIdentityVerifier } from 'mcp-dispatch/proxy'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { type Platform, createPlatform } from '../../examples/platform/index.js'
import { buildAppServer } from '../../examples/platform/mcp-app.js'
import { close, listen, loopbackFetch } from './helpers.js'
import { createNodeMcpHandler } from './mcp.js'
import { serveFetch } from '../helpers/platform.js'

describe('reference platform: versions served by an upstream', () => {
  let upstream: http.Server
  let upstreamOrigin: string
  let platform: Platform
  let served: http.Server
  let port: number
  let token: string
  const identities: VerifiedIdentity[] = []
  const authorizations: Array<string | undefined> = []
  const versionHandlers = new Map<string, ReturnType<typeof createNodeMcpHandler>>()

  beforeAll(async () => {
    const app = express()
    upstream = http.createServer(app)
    upstreamOrigin = `http://127.0.0.1:${await listen(upstream)}`
    const verifier: { verify?: ReturnType<typeof createIdentityVerifier> } = {}
    app.use(async (req, res, next) => {
      authorizations.push(req.headers.authorization)
      try {
        identities.push(await verifier.verify!(req.get('x-mcp-identity')))
        next()
      } catch {
        res.status(401).end()
      }
    })
    app.use(express.json())
    app.all('/weather/:version/mcp', (req, res) => {
      const version = String(req.params.version)
      let handler = versionHandlers.get(version)
      if (!handler) {
        handler = createNodeMcpHandler(() => buildAppServer({ slug: 'weather', name: 'Weather (upstream)' }, version))
        versionHandlers.set(version, handler)
      }
      void handler.handle(req, res, req.body)
    })

    platform = createPlatform({
      seed: {
        apps: [
          {
            id: 'app_weather',
            slug: 'weather',
            name: 'Weather',
            versions: ['1.0.0', { version: '2.0.0', upstream: `${upstreamOrigin}/weather/2.0.0/mcp` }],
          },
        ],
        users: [{ id: 'user_alice' }],
        subscriptions: [{ userId: 'user_alice', appId: 'app_weather', active: true }],
        tokens: [{ name: 'alice', userId: 'user_alice', servers: ['app_weather'], expiresInDays: 30 }],
      },
      onError: () => {},
    })
    token = platform.tokens.alice!
    const servedPlatform = await serveFetch((request, info) => platform.fetch(request, info))
    port = servedPlatform.port
    served = servedPlatform.server
    verifier.verify = createIdentityVerifier({
      jwks: `http://api.localhost:${port}/.well-known/jwks.json`,
      issuer: 'http://api.localhost',
      audience: upstreamOrigin,
      appId: 'app_weather',
      fetch: loopbackFetch as typeof fetch,
    })
  })
  afterAll(async () => {
    await platform?.close()
    for (const handler of versionHandlers.values()) await handler.close()
    if (served) await close(served)
    if (upstream) await close(upstream)
  })

  async function versionAt(path: string): Promise<{ text: unknown; server: string | undefined; header: string | null }> {
    let header: string | null = null
    const transport = new StreamableHTTPClientTransport(new URL(`http://weather.localhost:${port}${path}`), {
      requestInit: { headers: { authorization: `Bearer ${token}` } },
      fetch: async (input, init) => {
        const response = await loopbackFetch(input, init)
        header = response.headers.get('x-mcp-version')
        return response
      },
    })
    const client = new Client({ name: 'platform-proxy-test', version: '1.0.0' })
    await client.connect(transport)
    const result = await client.callTool({ name: 'get_version', arguments: {} })
    const server = client.getServerVersion()?.name
    await transport.terminateSession()
    await client.close()
    return { text: result.content, server, header }
  }

  it('publishes the JWKS on the API host', async () => {
    const response = await loopbackFetch(`http://api.localhost:${port}/.well-known/jwks.json`)
    expect(response.status).toBe(200)
    const jwks = (await response.json()) as { keys: Array<Record<string, unknown>> }
    expect(jwks.keys).toHaveLength(1)
    expect(jwks.keys[0]).toMatchObject({ kty: 'EC', crv: 'P-256', alg: 'ES256', use: 'sig' })
    expect(jwks.keys[0]!.d).toBeUndefined()
  })

  it('proxies an upstream version and serves a local one side by side', async () => {
    expect(await versionAt('/v2')).toEqual({ text: [{ type: 'text', text: '2.0.0' }], server: 'weather', header: '2.0.0' })
    expect(await versionAt('/v1')).toEqual({ text: [{ type: 'text', text: '1.0.0' }], server: 'weather', header: '1.0.0' })
    expect(identities.length).toBeGreaterThan(0)
    for (const identity of identities) {
      expect(identity).toMatchObject({ subject: 'user_alice', appId: 'app_weather', version: '2.0.0', method: 'api_token' })
    }
    expect(authorizations.every((a) => a === undefined)).toBe(true)
  })

  it('deploys a new version to an upstream', async () => {
    platform.deploy('app_weather', '2.1.0', `${upstreamOrigin}/weather/2.1.0/mcp`)
    expect(await versionAt('/')).toEqual({ text: [{ type: 'text', text: '2.1.0' }], server: 'weather', header: '2.1.0' })
    expect(identities.at(-1)!.version).toBe('2.1.0')
  })
})
