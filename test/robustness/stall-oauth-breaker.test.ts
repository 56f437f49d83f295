/**
 * Event-loop stalls (found by an audit): the OAuth validator's per-call timer (`timeoutMs`). Five
 * introspection calls answered by the authorization server in ~1 ms each, their answers waiting
 * unread on the sockets while the event loop is held past `timeoutMs`: after the hold Node runs
 * the expired timers before it reads the sockets. Each aborted its fetch, each counted as a
 * failure of the server, and the breaker (5 consecutive failures) opened for its 30 s cool-down,
 * every uncached OAuth token answered 503 though the server never failed. A deadline is now
 * judged once the sockets are read (`expireOnceRead`), as the Redis stores judge theirs.
 */
import * as http from 'node:http'
import type { AddressInfo } from 'node:net'
import { createOAuthValidator } from 'mcp-dispatch'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { holdEventLoop } from '../helpers/hold.js'

let server: http.Server
let base = ''
let served = 0
// Called once the n-th introspection answer was handed to the kernel.
let onServed: ((n: number) => void) | undefined

beforeAll(async () => {
  server = http.createServer((req, res) => {
    let body = ''
    req.on('data', (c: Buffer) => (body += c))
    req.on('end', () => {
      const token = new URLSearchParams(body).get('token') ?? ''
      res.setHeader('content-type', 'application/json')
      res.on('finish', () => onServed?.(++served))
      res.end(JSON.stringify({ active: true, sub: `user-${token}`, exp: Math.floor(Date.now() / 1000) + 3600 }))
    })
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
})
afterAll(async () => {
  server.closeAllConnections()
  await new Promise((resolve) => server.close(resolve))
})


function validator(timeoutMs = 1_000) {
  const events: string[] = []
  const v = createOAuthValidator({
    issuer: base,
    mode: 'introspection',
    introspection: { clientId: 'rs', clientSecret: 'secret', endpoint: `${base}/introspect` },
    audience: false,
    timeoutMs,
    onEvent: (e) => void (e.type === 'breaker' || e.type === 'upstream' ? events.push(`${e.type}:${'to' in e ? e.to : (e as { outcome: string }).outcome}`) : undefined),
  })
  return { v, events }
}

async function fiveAtOnce(holdMs: number, timeoutMs = 1_000) {
  const { v, events } = validator(timeoutMs)
  served = 0
  // The stall starts right after the fifth answer went out: all five answers are on the sockets.
  onServed = (n) => {
    if (n === 5 && holdMs > 0) holdEventLoop(holdMs)
  }
  const results = await Promise.allSettled(
    ['tok1', 'tok2', 'tok3', 'tok4', 'tok5'].map((t) => v.validate(`${t}-${holdMs}`, { resource: 'https://weather.example.com', appId: 'app_weather', clientAddress: `203.0.113.${t.at(-1)}` })),
  )
  onServed = undefined
  const outcome = results.map((r) => (r.status === 'fulfilled' ? (r.value.active ? 'active' : 'refused') : (r.reason as Error).name))
  // A sixth token, after the stall, from a client that sent nothing before.
  const later = await v.validate(`tok6-${holdMs}`, { resource: 'https://weather.example.com', appId: 'app_weather', clientAddress: '198.51.100.1' }).then(
    (r) => (r.active ? 'active' : 'refused'),
    (e: Error) => `${e.name} ${e.message}`,
  )
  return { outcome, later, breaker: v.breakerState, events }
}

describe('OAuth validator: a stall of this process while introspection answers wait on the sockets', () => {
  it('control: no stall', async () => {
    const r = await fiveAtOnce(0)
    expect(r.outcome).toEqual(['active', 'active', 'active', 'active', 'active'])
    expect(r.later).toBe('active')
    expect(r.breaker).toBe('closed')
  })

  it('control: a stall shorter than timeoutMs (900 ms) changes nothing', async () => {
    const r = await fiveAtOnce(900)
    expect(r.outcome).toEqual(['active', 'active', 'active', 'active', 'active'])
    expect(r.breaker).toBe('closed')
  })

  it('a 1.5 s stall past timeoutMs 1 s, the server having answered in ~1 ms: all five served, the breaker closed (regression: all five 503, the breaker open for 30 s)', async () => {
    const r = await fiveAtOnce(1_500)
    expect({ outcome: r.outcome, later: r.later, breaker: r.breaker }).toEqual({
      outcome: ['active', 'active', 'active', 'active', 'active'],
      later: 'active',
      breaker: 'closed',
    })
  })
})
