import fc from 'fast-check'
import { describe, expect, it } from 'vitest'
import { checkScope } from './scope.js'

describe('checkScope (spec 5.2, 7: 403 -32003 outside the scope)', () => {
  it('allows exactly the Apps the token was created for', () => {
    expect(checkScope(['app_weather'], 'app_weather')).toBe(true)
    expect(checkScope(['app_weather', 'app_notes'], 'app_notes')).toBe(true)
    expect(checkScope(['app_weather'], 'app_notes')).toBe(false)
    expect(checkScope([], 'app_weather')).toBe(false)
  })

  it('compares ids as given: no prefix, case folding or trimming makes another App reachable', () => {
    for (const appId of ['app_weathe', 'app_weather2', 'APP_WEATHER', ' app_weather', 'app_weather ', '']) {
      expect(checkScope(['app_weather'], appId), JSON.stringify(appId)).toBe(false)
    }
  })

  it('for any scope and App: allowed exactly when the App is one of the scope', () => {
    fc.assert(
      fc.property(fc.array(fc.string({ maxLength: 8 }), { maxLength: 6 }), fc.string({ maxLength: 8 }), (servers, appId) => {
        expect(checkScope(servers, appId)).toBe(servers.some((s) => s === appId))
      }),
    )
  })
})
