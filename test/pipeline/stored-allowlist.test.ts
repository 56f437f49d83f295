/**
 * An allowlist entry stored past `validateAllowlist` (a row edited by hand, an import, a seed)
 * that is no address or CIDR range: it matches no address, the token's other entries still do,
 * and the token's id is reported once. Found by an audit: such a token got 503 "temporarily
 * unavailable" with `Retry-After: 1` on every request, for ever, blamed on the token store.
 */
import {
  createDispatcher,
  createMemoryAppStore,
  createMemorySubscriptionStore,
  createMemoryTokenStore,
  createTokenService,
  displayPrefix,
  generateApiToken,
  hashApiToken,
} from 'mcp-dispatch'
import { mcpDispatch } from 'mcp-dispatch/web'
import { describe, expect, it } from 'vitest'

const NOW = Date.UTC(2030, 0, 1)

function setup() {
  const apps = createMemoryAppStore([{ id: 'app_weather', slug: 'weather', name: 'Weather', versions: ['1.0.0'] }])
  const subscriptions = createMemorySubscriptionStore([{ userId: 'alice', appId: 'app_weather', active: true }])
  const store = createMemoryTokenStore()
  const errors: Array<{ error: unknown; context: string }> = []
  const onError = (error: unknown, context: string) => errors.push({ error, context })
  const tokens = createTokenService({ store, apps, subscriptions, now: () => NOW, onError })
  const dispatcher = createDispatcher({ apps, subscriptions, tokens, now: () => NOW, onError })
  const handle = mcpDispatch({ dispatcher, onError, handler: () => new Response('{"jsonrpc":"2.0","id":1,"result":{}}', { headers: { 'content-type': 'application/json' } }) })
  const stored = (allowedIps: string[]) => {
    const secret = generateApiToken()
    const id = crypto.randomUUID()
    store.insert({
      id,
      userId: 'alice',
      name: 'imported',
      tokenHash: hashApiToken(secret),
      displayPrefix: displayPrefix(secret),
      servers: ['app_weather'],
      allowedIps,
      expiresAt: NOW + 86_400_000,
      createdAt: NOW,
      lastUsedAt: null,
      revokedAt: null,
    })
    return { secret, id }
  }
  const call = async (secret: string, clientAddress: string) => {
    const response = await handle(
      new Request('http://weather.localhost/', { method: 'POST', body: '{"jsonrpc":"2.0","id":1,"method":"tools/list"}', headers: { authorization: `Bearer ${secret}`, 'content-type': 'application/json' } }),
      { clientAddress },
    )
    return { status: response.status, body: await response.text() }
  }
  return { stored, call, errors }
}

describe('an unreadable allowlist entry in the token store', () => {
  it('matches no address; the readable entries still match; 403 ip_not_allowed elsewhere, never 503', async () => {
    const { stored, call, errors } = setup()
    const { secret, id } = stored(['10.0.0.1/24', '127.0.0.1', 'garbage'])
    expect((await call(secret, '127.0.0.1')).status).toBe(200)
    const refused = await call(secret, '10.0.0.5')
    expect(refused.status).toBe(403)
    expect(JSON.parse(refused.body).error.data).toEqual({ error: 'ip_not_allowed' })
    // Reported once, naming the token (not its secret), whatever the number of requests.
    await call(secret, '10.0.0.5')
    expect(errors.map((e) => e.context)).toEqual(['token allowlist'])
    const message = String(errors[0]!.error)
    expect(message).toContain(id)
    expect(message).not.toContain(secret)
  })

  it('a list of nothing but unreadable entries allows no address', async () => {
    const { stored, call } = setup()
    const { secret } = stored(['garbage', '999.1.1.1'])
    expect((await call(secret, '127.0.0.1')).status).toBe(403)
  })
})
