/**
 * Load: the reference platform (real MCP SDK server per version, Web adapter on
 * `@hono/node-server`) over loopback, 100 requests in flight, a mix of valid and invalid
 * tokens and of version paths. Zero 5xx, and every answer is the right one for its request:
 * status, `X-MCP-Version`, and the version the App itself reports (`get_version`).
 *
 * `LOAD_REQUESTS` sets the number of requests: 20,000 by default (issue 5), fewer on a
 * small machine (`LOAD_REQUESTS=5000 npm test`).
 */
import * as http from 'node:http'
import type { AddressInfo } from 'node:net'
import { serve } from '@hono/node-server'
import { generateApiToken } from 'mcp-dispatch'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { type Platform, createPlatform } from '../../examples/platform/index.js'
import { API_TOKEN_PATTERN, T0, jsonRpcError, send } from './support.js'

const REQUESTS = Number(process.env.LOAD_REQUESTS ?? 20_000)
const CONCURRENCY = 100
/** Requests the limited App allows per minute; the clock stands still, so exactly this many pass. */
const LIMIT = 40

type TokenKind = 'valid' | 'rotated' | 'otherApp' | 'unsubscribed' | 'malformed' | 'unknown' | 'revoked' | 'rotatedOld' | 'none' | 'limited'

/** Paths on the weather App and the version each resolves to (`null`: 404 version_not_found). */
const PATHS: Record<string, string | null> = {
  '/': '2.0.0',
  '/v1': '1.1.1',
  '/v1.1': '1.1.1',
  '/v1.1.1': '1.1.1',
  '/v1.0': '1.0.0',
  '/v1.0.0': '1.0.0',
  '/v2': '2.0.0',
  '/v2.0.0': '2.0.0',
  '/v1.1.0': null, // replaced by 1.1.1
  '/v3': null,
}

interface Case {
  kind: TokenKind
  path: string
}

/** What the platform must answer to a case. */
function expected(c: Case): { status: number; version?: string } {
  switch (c.kind) {
    case 'malformed':
    case 'unknown':
    case 'revoked':
    case 'rotatedOld':
    case 'none':
      return { status: 401 }
    case 'otherApp':
      return { status: 403 }
    case 'unsubscribed':
      return { status: 402 }
    case 'limited':
      return { status: 200, version: '1.0.0' } // or 429 once the limit is spent (counted apart)
    default: {
      const version = PATHS[c.path]
      return version === null || version === undefined ? { status: 404 } : { status: 200, version }
    }
  }
}

describe(`load: ${REQUESTS} requests, ${CONCURRENCY} in flight, through the reference platform`, () => {
  let platform: Platform
  let server: http.Server
  let port: number
  const errors: Array<{ error: unknown; context: string }> = []
  const logged: string[] = []
  const tokens = {} as Record<Exclude<TokenKind, 'none'>, string>

  beforeAll(async () => {
    platform = createPlatform({
      seed: {
        apps: [
          { id: 'app_weather', slug: 'weather', name: 'Weather', versions: ['1.0.0', '1.1.0', '1.1.1', '2.0.0'] },
          { id: 'app_notes', slug: 'notes', name: 'Notes', versions: ['1.0.0'] },
          { id: 'app_limited', slug: 'limited', name: 'Limited', versions: ['1.0.0'], rateLimitPerMinute: LIMIT },
        ],
        users: [{ id: 'alice' }, { id: 'bob' }],
        subscriptions: [
          { userId: 'alice', appId: 'app_weather', active: true },
          { userId: 'alice', appId: 'app_notes', active: true },
          { userId: 'alice', appId: 'app_limited', active: true },
          { userId: 'bob', appId: 'app_weather', active: false },
        ],
        tokens: [
          { name: 'valid', userId: 'alice', servers: ['app_weather'], expiresInDays: 30 },
          { name: 'otherApp', userId: 'alice', servers: ['app_notes'], expiresInDays: 30 },
          { name: 'unsubscribed', userId: 'bob', servers: ['app_weather'], expiresInDays: 30 },
          { name: 'limited', userId: 'alice', servers: ['app_limited'], expiresInDays: 30 },
        ],
      },
      now: () => T0,
      onError: (error, context) => errors.push({ error, context }),
    })
    Object.assign(tokens, platform.tokens)
    const service = platform.tokenService
    const revoked = await service.create({ userId: 'alice', name: 'revoked', servers: ['app_weather'], expiresInDays: 7 })
    await service.revoke('alice', revoked.id)
    const old = await service.create({ userId: 'alice', name: 'rotated', servers: ['app_weather'], expiresInDays: 7 })
    const rotated = await service.rotate(old.id, { kind: 'session', userId: 'alice' })
    Object.assign(tokens, {
      revoked: revoked.token,
      rotatedOld: old.token,
      rotated: rotated.token,
      malformed: 'svc_not-a-real-token',
      // Well-formed (checksum and all) but never issued.
      unknown: generateApiToken(),
    })
    server = await new Promise<http.Server>((resolve) => {
      const s: http.Server = serve(
        {
          port: 0,
          hostname: '127.0.0.1',
          fetch: (request: Request, env: { incoming?: { socket?: { remoteAddress?: string } } }) =>
            platform.fetch(request, { clientAddress: env.incoming?.socket?.remoteAddress }),
        },
        () => resolve(s),
      ) as http.Server
    })
    port = (server.address() as AddressInfo).port
  })

  afterAll(async () => {
    server?.closeAllConnections()
    await new Promise<void>((resolve) => (server ? server.close(() => resolve()) : resolve()))
    await platform?.close()
  })

  it('answers every request correctly for what it asked, with zero 5xx', { timeout: 180_000 }, async () => {
    // A fixed, shuffled mix: 60 % valid tokens over every path, the rest refused for a reason each.
    const kinds: TokenKind[] = ['valid', 'valid', 'valid', 'valid', 'valid', 'rotated', 'otherApp', 'unsubscribed', 'malformed', 'unknown', 'revoked', 'rotatedOld', 'none', 'limited']
    const paths = Object.keys(PATHS)
    // Every kind in turn, and each kind over every path in turn (regression: a stride sharing a
    // factor with the number of kinds sent 2 of them only).
    const cases: Case[] = Array.from({ length: REQUESTS }, (_, i) => ({
      kind: kinds[i % kinds.length]!,
      path: paths[Math.floor(i / kinds.length) % paths.length]!,
    }))
    const combos = new Set(cases.map((c) => `${c.kind} ${c.path}`))
    expect(combos.size, 'every kind over every path').toBe(new Set(kinds).size * paths.length)

    const agent = new http.Agent({ keepAlive: true, maxSockets: CONCURRENCY })
    const wrong: string[] = []
    const byStatus = new Map<number, number>()
    let limitedServed = 0
    let limitedRefused = 0
    let next = 0
    const worker = async () => {
      while (next < cases.length) {
        // Each request's own JSON-RPC id, echoed by the App: answers crossed between
        // concurrent requests of one version would carry another's.
        const id = next
        const c = cases[next++]!
        const host = c.kind === 'limited' ? 'limited' : 'weather'
        const response = await send(
          port,
          {
            method: 'POST',
            path: c.kind === 'limited' ? '/v1' : c.path,
            headers: {
              host: `${host}.localhost:${port}`,
              'content-type': 'application/json',
              accept: 'application/json, text/event-stream',
              ...(c.kind !== 'none' && { authorization: `Bearer ${tokens[c.kind]}` }),
            },
            body: JSON.stringify({ jsonrpc: '2.0', id, method: 'tools/call', params: { name: 'get_version', arguments: {} } }),
          },
          agent,
          30_000,
        )
        byStatus.set(response.status, (byStatus.get(response.status) ?? 0) + 1)
        const want = expected(c)
        if (c.kind === 'limited' && response.status === 429) {
          limitedRefused++
          if (!response.headers['retry-after'] || jsonRpcError(response.body)?.code !== -32000) wrong.push(`429 without its body: ${response.body}`)
          continue
        }
        if (response.status !== want.status) {
          wrong.push(`${c.kind} ${c.path}: ${response.status}, expected ${want.status}: ${response.body.toString().slice(0, 200)}`)
          continue
        }
        if (want.version === undefined) {
          // Refused by the dispatch layer: a JSON-RPC error, no version headers.
          if (!jsonRpcError(response.body) || response.headers['x-mcp-version'] !== undefined) {
            wrong.push(`${c.kind} ${c.path}: malformed refusal ${response.body.toString().slice(0, 200)}`)
          }
          continue
        }
        if (c.kind === 'limited') limitedServed++
        const answer = JSON.parse(response.body.toString()) as { id?: unknown; result?: { structuredContent?: { version?: string } } }
        const reported = answer.result?.structuredContent?.version
        if (response.headers['x-mcp-version'] !== want.version || reported !== want.version || answer.id !== id) {
          wrong.push(`${c.kind} ${c.path} #${id}: X-MCP-Version ${String(response.headers['x-mcp-version'])}, App says ${reported} for #${String(answer.id)}, expected ${want.version}`)
        }
      }
    }
    const originalError = console.error
    console.error = (...args: unknown[]) => logged.push(args.map(String).join(' '))
    try {
      await Promise.all(Array.from({ length: CONCURRENCY }, worker))
    } finally {
      console.error = originalError
      agent.destroy()
    }

    expect(wrong.slice(0, 10), `${wrong.length} wrong answers`).toEqual([])
    expect([...byStatus.keys()].filter((s) => s >= 500)).toEqual([])
    expect(limitedServed).toBe(Math.min(LIMIT, cases.filter((c) => c.kind === 'limited').length))
    expect(limitedServed + limitedRefused).toBe(cases.filter((c) => c.kind === 'limited').length)
    expect(errors).toEqual([])
    // Whatever was logged under load, no token in it.
    expect(logged.filter((line) => API_TOKEN_PATTERN.test(line))).toEqual([])
  })
})
