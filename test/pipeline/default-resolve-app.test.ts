/**
 * The default `resolveApp`: the first label of the Host is the App slug. A host name ending in
 * a dot is the same name to DNS, but another address to HTTP clients (its own origin, its own
 * metadata `resource`), so it is no App: one App, one address.
 */
import {
  type DispatchRequest,
  createDispatcher,
  createMemoryAppStore,
  createMemorySubscriptionStore,
  createMemoryTokenStore,
  createTokenService,
} from 'mcp-dispatch'
import { describe, expect, it } from 'vitest'
import { dispatchRequest } from '../helpers/dispatch-request.js'

const APP = { id: 'app_weather', slug: 'weather', name: 'Weather', versions: ['1.0.0'] }

async function setup() {
  const apps = createMemoryAppStore([APP])
  const subscriptions = createMemorySubscriptionStore([{ userId: 'user_1', appId: APP.id, active: true }])
  const tokens = createTokenService({ store: createMemoryTokenStore(), apps, subscriptions })
  const { token } = await tokens.create({ userId: 'user_1', name: 't', servers: [APP.id], expiresInDays: 30 })
  return { dispatcher: createDispatcher({ apps, subscriptions, tokens }), token }
}

function request(host: string, path: string, token?: string): DispatchRequest {
  const method = path.startsWith('/.well-known') ? 'GET' : 'POST'
  return { ...dispatchRequest(path, token ? { authorization: `Bearer ${token}` } : {}), method, host, origin: `https://${host}` }
}

async function outcome(decision: ReturnType<ReturnType<typeof createDispatcher>['decide']>) {
  const settled = await decision
  return settled.type === 'reply' ? { status: settled.reply.status, body: settled.reply.body } : { status: 'dispatch', version: settled.context.version }
}

describe('the default resolveApp', () => {
  it('serves the App named by the first label of the Host, port or not, in any case (host names are case-insensitive)', async () => {
    const { dispatcher, token } = await setup()
    for (const host of ['weather.example.com', 'weather.example.com:8443', 'weather.localhost', 'WEATHER.example.com', 'Weather.Localhost:8787']) {
      expect(await outcome(dispatcher.decide(request(host, '/v1', token))), host).toEqual({ status: 'dispatch', version: '1.0.0' })
    }
  })

  it('a host name ending in a dot is no App (404 not_found), and has no metadata: the App keeps one address', async () => {
    const { dispatcher, token } = await setup()
    for (const host of ['weather.example.com.', 'weather.example.com.:8443', 'weather.localhost.']) {
      const mcp = await outcome(dispatcher.decide(request(host, '/v1', token)))
      expect(mcp.status, host).toBe(404)
      expect(JSON.stringify(mcp)).toContain('not_found')
      expect((await outcome(dispatcher.decide(request(host, '/.well-known/oauth-protected-resource')))).status, host).toBe(404)
    }
    // The metadata of the App's own address names that address.
    const doc = await dispatcher.decide(request('weather.example.com', '/.well-known/oauth-protected-resource'))
    if (doc.type !== 'reply') throw new Error('expected the metadata reply')
    expect(doc.reply.status).toBe(200)
    expect(JSON.parse(String(doc.reply.body))).toMatchObject({ resource: 'https://weather.example.com' })
  })

  it('a host without a dot, or an IP address, is no App', async () => {
    const { dispatcher, token } = await setup()
    for (const host of ['weather', 'weather:8443', '[::1]:8443', '[::1]', '127.0.0.1:8080']) {
      expect((await outcome(dispatcher.decide(request(host, '/v1', token)))).status, host).toBe(404)
    }
  })
})

describe('a request that names no host (HTTP/1.0, an empty Host), with a resolveApp of the platform\'s', () => {
  it('names no App without baseUrl (404 not_found: its address would be "http://"); with baseUrl it is served', async () => {
    const apps = createMemoryAppStore([APP])
    const subscriptions = createMemorySubscriptionStore([{ userId: 'user_1', appId: APP.id, active: true }])
    const tokens = createTokenService({ store: createMemoryTokenStore(), apps, subscriptions })
    const { token } = await tokens.create({ userId: 'user_1', name: 't', servers: [APP.id], expiresInDays: 30 })
    const everyRequest = () => apps.getAppBySlug('weather')
    const hostless = (path: string, withToken?: string): DispatchRequest => ({ ...request('', path, withToken), host: undefined, origin: 'http://' })
    // `baseUrl: null` (a config loader's unset value) is none, as one left out (regression: a
    // 401 naming `http:///.well-known/…`).
    for (const byHost of [
      createDispatcher({ apps, subscriptions, tokens, resolveApp: everyRequest }),
      createDispatcher({ apps, subscriptions, tokens, resolveApp: everyRequest, baseUrl: null as never }),
    ]) {
      for (const [path, withToken] of [['/v1', token], ['/v1', undefined], ['/.well-known/oauth-protected-resource', undefined]] as const) {
        const answer = await outcome(byHost.decide(hostless(path, withToken)))
        expect(answer.status, path).toBe(404)
        expect(JSON.parse(String(answer.body)).error.data).toEqual({ error: 'not_found' })
      }
    }
    const addressed = createDispatcher({ apps, subscriptions, tokens, resolveApp: everyRequest, baseUrl: () => 'https://weather.example.com' })
    expect(await outcome(addressed.decide(hostless('/v1', token)))).toEqual({ status: 'dispatch', version: '1.0.0' })
    const doc = await outcome(addressed.decide(hostless('/.well-known/oauth-protected-resource')))
    expect(JSON.parse(String(doc.body))).toMatchObject({ resource: 'https://weather.example.com' })
  })
})
