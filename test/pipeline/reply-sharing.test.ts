/**
 * Refusal replies are built once and shared between requests (the 401 path is the one an
 * attacker drives hardest), so they must be frozen and must still name the right App address.
 */
import {
  createDispatcher,
  createMemoryAppStore,
  createMemorySubscriptionStore,
  createMemoryTokenStore,
  createTokenService,
  type DispatchRequest,
} from 'mcp-dispatch'
import { describe, expect, it } from 'vitest'

function setup() {
  const apps = createMemoryAppStore([
    { id: 'a1', slug: 'weather', name: 'Weather', versions: ['1.0.0'] },
    { id: 'a2', slug: 'notes', name: 'Notes', versions: ['1.0.0'] },
  ])
  const subscriptions = createMemorySubscriptionStore()
  const tokens = createTokenService({ store: createMemoryTokenStore(), apps, subscriptions })
  return createDispatcher({ apps, subscriptions, tokens })
}

function request(host: string, authorization?: string): DispatchRequest {
  const headers = new Headers(authorization ? { authorization } : {})
  return { method: 'POST', path: '/v1', host, origin: `https://${host}`, headers, clientAddress: '192.0.2.1' }
}

describe('shared 401 replies', () => {
  it('are frozen, so an adapter cannot change the answer to later requests', async () => {
    const dispatcher = setup()
    const first = await dispatcher.decide(request('weather.example.com'))
    expect(first.type).toBe('reply')
    if (first.type !== 'reply') return
    expect(Object.isFrozen(first.reply)).toBe(true)
    expect(Object.isFrozen(first.reply.headers)).toBe(true)
    expect(() => {
      ;(first.reply.headers as Record<string, string>)['x-mcp-version'] = '9.9.9'
    }).toThrow(TypeError)
    const second = await dispatcher.decide(request('weather.example.com'))
    expect(second.type === 'reply' && second.reply.headers['x-mcp-version']).toBe(undefined)
  })

  it('name the App address of each request and tell a refused token from a missing one', async () => {
    const dispatcher = setup()
    const answers = await Promise.all([
      dispatcher.decide(request('weather.example.com')),
      dispatcher.decide(request('notes.example.com')),
      dispatcher.decide(request('weather.example.com', 'Bearer svc_not_a_real_token')),
    ])
    const challenges = answers.map((a) => (a.type === 'reply' ? a.reply.headers['www-authenticate'] : undefined))
    expect(challenges).toEqual([
      'Bearer resource_metadata="https://weather.example.com/.well-known/oauth-protected-resource"',
      'Bearer resource_metadata="https://notes.example.com/.well-known/oauth-protected-resource"',
      'Bearer resource_metadata="https://weather.example.com/.well-known/oauth-protected-resource", error="invalid_token"',
    ])
  })
})
