import { describe, expect, it } from 'vitest'
import { createPlatform } from '../../examples/platform/index.js'

const base = {
  apps: [{ id: 'app_w', slug: 'weather', name: 'Weather', versions: ['1.0.0'] }],
  users: [{ id: 'u1' }],
  subscriptions: [{ userId: 'u1', appId: 'app_w', active: true }],
}

describe('reference platform seed validation', () => {
  it('refuses an allowlist entry that is not an address or CIDR range, naming it', () => {
    const seed = { ...base, tokens: [{ name: 't', userId: 'u1', servers: ['app_w'], expiresInDays: 7 as const, allowedIps: ['10.0.0.1/33'] }] }
    expect(() => createPlatform({ seed })).toThrow(/allowedIps entry 0 .*prefix length/)
  })

  it('refuses the slug reserved for the token API host', () => {
    const seed = { ...base, apps: [{ id: 'app_a', slug: 'api', name: 'API', versions: ['1.0.0'] }] }
    expect(() => createPlatform({ seed })).toThrow(/reserved/)
  })

  it('refuses a deploy sequence the versions rule refuses', () => {
    const seed = { ...base, apps: [{ id: 'app_w', slug: 'weather', name: 'Weather', versions: ['1.0.1', '1.0.0'] }] }
    expect(() => createPlatform({ seed })).toThrow(/1\.0\.0/)
  })

  it('refuses a token for an unknown user or App', () => {
    expect(() => createPlatform({ seed: { ...base, tokens: [{ name: 't', userId: 'nobody', servers: ['app_w'], expiresInDays: 7 as const }] } })).toThrow(/unknown user/)
    expect(() => createPlatform({ seed: { ...base, tokens: [{ name: 't', userId: 'u1', servers: ['app_x'], expiresInDays: 7 as const }] } })).toThrow(/unknown App/)
  })
})
