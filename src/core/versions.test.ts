import { describe, expect, it } from 'vitest'
import { DeployRefusedError } from '../errors.js'
import {
  MAX_VERSION_LENGTH,
  type VersionSelector,
  applyDeploy,
  compileVersions,
  formatSelector,
  parseVersionPath,
  resolveVersion,
} from './versions.js'

const latest: VersionSelector = { kind: 'latest' }
const major = (m: number): VersionSelector => ({ kind: 'major', major: m })
const minor = (m: number, n: number): VersionSelector => ({ kind: 'minor', major: m, minor: n })
const exact = (version: string): VersionSelector => ({ kind: 'exact', version })

/** Deploys versions in order through the rule, as a store does. */
function deployAll(versions: readonly string[]): string[] {
  return versions.reduce<string[]>((live, v) => applyDeploy(live, v), [])
}

/** Resolves a URL path against a live set, end to end. */
function resolvePath(live: readonly string[], path: string): string | null {
  const selector = parseVersionPath(path)
  if (!selector) throw new Error(`path ${path} did not parse`)
  return resolveVersion(compileVersions(live), selector)
}

describe('parseVersionPath (spec 4.1, 9.1)', () => {
  it('versionless: "/" and ""', () => {
    expect(parseVersionPath('/')).toEqual(latest)
    expect(parseVersionPath('')).toEqual(latest)
  })

  it('major, minor, exact, with or without a trailing slash', () => {
    expect(parseVersionPath('/v1')).toEqual(major(1))
    expect(parseVersionPath('/v1/')).toEqual(major(1))
    expect(parseVersionPath('/v0')).toEqual(major(0))
    expect(parseVersionPath('/v1.2')).toEqual(minor(1, 2))
    expect(parseVersionPath('/v1.2/')).toEqual(minor(1, 2))
    expect(parseVersionPath('/v1.2.3')).toEqual(exact('1.2.3'))
    expect(parseVersionPath('/v1.2.3/')).toEqual(exact('1.2.3'))
    expect(parseVersionPath('/v10.20.30')).toEqual(exact('10.20.30'))
  })

  it('exact pre-releases', () => {
    expect(parseVersionPath('/v1.2.3-rc.1')).toEqual(exact('1.2.3-rc.1'))
    expect(parseVersionPath('/v1.2.3-alpha')).toEqual(exact('1.2.3-alpha'))
    expect(parseVersionPath('/v1.2.3-0a.1-b')).toEqual(exact('1.2.3-0a.1-b'))
    expect(parseVersionPath('/v1.2.3-0')).toEqual(exact('1.2.3-0'))
  })

  it('accepts the largest safe integers and refuses larger ones', () => {
    expect(parseVersionPath('/v9007199254740991')).toEqual(major(9007199254740991))
    expect(parseVersionPath('/v9007199254740992')).toBeNull()
    expect(parseVersionPath('/v1.9007199254740992')).toBeNull()
    expect(parseVersionPath('/v1.2.9007199254740992')).toBeNull()
    expect(parseVersionPath('/v99999999999999999999')).toBeNull()
  })

  it('refuses a path longer than 128 characters, even a well-formed one', () => {
    const version = `1.1.0-${'a'.repeat(120)}` // 126 characters: one past MAX_VERSION_LENGTH
    expect(parseVersionPath(`/v${version}`)).toEqual(exact(version)) // 128 characters
    expect(parseVersionPath(`/v${version}/`)).toBeNull() // 129 characters
    expect(parseVersionPath(`/v1.2.3-${'a'.repeat(121)}`)).toBeNull() // 129 characters, no trailing slash
  })

  it('refuses everything else', () => {
    for (const bad of [
      '/v',
      '/v/',
      '/v1.x',
      '/v1.2.x',
      '/v01',
      '/v1.02',
      '/v1.2.03',
      '/1.2',
      '/1',
      '/v1.2.3+build',
      '/v1.2.3-rc.1+build',
      '/v1.2.3.4',
      '/V1',
      '/v1.',
      '/v1..2',
      '/v1.2.',
      '/v-1',
      '/v1.2.3-',
      '/v1.2.3-rc..1',
      '/v1.2.3-01',
      '/v1.2.3-rc_1',
      '/v1//',
      '//',
      '/v1/tools',
      'v1',
      '/ v1',
      '/v1 ',
      '/v1?x=1',
      '/v１',
      '/latest',
      '/v' + '1'.repeat(200),
      '/v1.2.3-' + 'a'.repeat(200),
    ]) {
      expect(parseVersionPath(bad), JSON.stringify(bad)).toBeNull()
    }
  })

  it('decodes percent-encoded unreserved characters (RFC 3986 6.2.2.2), and no other escape', () => {
    expect(parseVersionPath('/v%31')).toEqual(major(1))
    expect(parseVersionPath('/%76%31%2E%32')).toEqual(minor(1, 2))
    expect(parseVersionPath('/v1.2.3-rc%2e1')).toEqual(exact('1.2.3-rc.1'))
    expect(parseVersionPath('/%2F')).toBeNull()
    expect(parseVersionPath('/v1%2F')).toBeNull()
    expect(parseVersionPath('/v1%2B')).toBeNull()
    expect(parseVersionPath('/v1%')).toBeNull()
    expect(parseVersionPath('/v1%3')).toBeNull()
    expect(parseVersionPath('/v%30%31')).toBeNull()
    expect(parseVersionPath(`/v1${'%20'.repeat(200)}`)).toBeNull()
  })

  it('formatSelector writes the selector as it appeared in the URL', () => {
    expect(formatSelector(latest)).toBe('latest')
    expect(formatSelector(major(1))).toBe('1')
    expect(formatSelector(minor(1, 2))).toBe('1.2')
    expect(formatSelector(exact('1.2.3-rc.1'))).toBe('1.2.3-rc.1')
  })
})

describe('compileVersions', () => {
  it('sorts the live set by precedence and names the latest release', () => {
    const index = compileVersions(['1.10.0', '1.2.0', '2.0.0-rc.1', '1.9.3'])
    expect(index.live).toEqual(['1.2.0', '1.9.3', '1.10.0', '2.0.0-rc.1'])
    expect(index.latest).toBe('1.10.0')
  })

  it('latest is the highest pre-release when only pre-releases are live, null when nothing is', () => {
    expect(compileVersions(['1.0.0-rc.1', '1.0.0-rc.2']).latest).toBe('1.0.0-rc.2')
    expect(compileVersions([]).latest).toBeNull()
  })

  it('refuses invalid entries and build metadata', () => {
    expect(() => compileVersions(['1.2'])).toThrow(RangeError)
    expect(() => compileVersions(['1.2.3+build'])).toThrow(RangeError)
    expect(() => compileVersions(['x'])).toThrow(RangeError)
    // semver.parse would clean these up into 1.2.3; no URL names them so.
    expect(() => compileVersions([' v1.2.3'])).toThrow(RangeError)
    expect(() => compileVersions(['v1.2.3'])).toThrow(RangeError)
  })
})

describe('resolveVersion (spec 9.1)', () => {
  const live = ['1.0.4', '1.1.2', '1.3.0', '1.4.0-rc.1', '2.0.1', '3.0.0-beta.2']
  const index = compileVersions(live)

  it('exact: that version only', () => {
    expect(resolveVersion(index, exact('1.1.2'))).toBe('1.1.2')
    expect(resolveVersion(index, exact('1.1.1'))).toBeNull()
    expect(resolveVersion(index, exact('1.1.3'))).toBeNull()
    expect(resolveVersion(index, exact('1.2.0'))).toBeNull()
  })

  it('exact: pre-releases by their exact URL', () => {
    expect(resolveVersion(index, exact('1.4.0-rc.1'))).toBe('1.4.0-rc.1')
    expect(resolveVersion(index, exact('3.0.0-beta.2'))).toBe('3.0.0-beta.2')
    expect(resolveVersion(index, exact('3.0.0-beta.1'))).toBeNull()
  })

  it('minor: highest live patch within the minor', () => {
    expect(resolveVersion(index, minor(1, 0))).toBe('1.0.4')
    expect(resolveVersion(index, minor(1, 1))).toBe('1.1.2')
    expect(resolveVersion(index, minor(1, 2))).toBeNull()
    expect(resolveVersion(index, minor(2, 0))).toBe('2.0.1')
  })

  it('minor: never a pre-release', () => {
    expect(resolveVersion(index, minor(1, 4))).toBeNull()
    expect(resolveVersion(index, minor(3, 0))).toBeNull()
  })

  it('major: highest live version within the major (greedy), never a pre-release', () => {
    expect(resolveVersion(index, major(1))).toBe('1.3.0')
    expect(resolveVersion(index, major(2))).toBe('2.0.1')
    expect(resolveVersion(index, major(3))).toBeNull()
    expect(resolveVersion(index, major(4))).toBeNull()
  })

  it('latest: highest live release, never a pre-release', () => {
    expect(resolveVersion(index, latest)).toBe('2.0.1')
    expect(index.latest).toBe('2.0.1')
  })

  it('latest when only pre-releases are live: nothing resolves', () => {
    const pre = compileVersions(['1.0.0-rc.1'])
    expect(resolveVersion(pre, latest)).toBeNull()
    expect(resolveVersion(pre, major(1))).toBeNull()
    expect(resolveVersion(pre, exact('1.0.0-rc.1'))).toBe('1.0.0-rc.1')
  })

  it('nothing live: nothing resolves', () => {
    const empty = compileVersions([])
    for (const s of [latest, major(1), minor(1, 0), exact('1.0.0')]) expect(resolveVersion(empty, s)).toBeNull()
  })

  it('major 0 is a line like any other', () => {
    const zero = compileVersions(['0.1.0', '0.2.5'])
    expect(resolveVersion(zero, major(0))).toBe('0.2.5')
    expect(resolveVersion(zero, latest)).toBe('0.2.5')
  })

  it('numeric, not lexical, order', () => {
    const idx = compileVersions(['1.9.0', '1.10.0', '10.0.0', '9.0.0'])
    expect(resolveVersion(idx, major(1))).toBe('1.10.0')
    expect(resolveVersion(idx, latest)).toBe('10.0.0')
  })

  it('end to end from the URL path', () => {
    expect(resolvePath(live, '/')).toBe('2.0.1')
    expect(resolvePath(live, '/v1')).toBe('1.3.0')
    expect(resolvePath(live, '/v1/')).toBe('1.3.0')
    expect(resolvePath(live, '/v1.1')).toBe('1.1.2')
    expect(resolvePath(live, '/v1.1.2')).toBe('1.1.2')
    expect(resolvePath(live, '/v1.4.0-rc.1')).toBe('1.4.0-rc.1')
    expect(resolvePath(live, '/v1.0.3')).toBeNull()
  })
})

describe('applyDeploy (DESIGN.md "Versions")', () => {
  it('a first deploy makes the version live', () => {
    expect(applyDeploy([], '1.0.0')).toEqual(['1.0.0'])
  })

  it('a new patch replaces the old one; the old exact URL no longer resolves', () => {
    const before = ['1.2.3']
    const after = applyDeploy(before, '1.2.4')
    expect(after).toEqual(['1.2.4'])
    expect(before).toEqual(['1.2.3']) // pure: the input is not changed
    expect(resolvePath(after, '/v1.2.3')).toBeNull()
    expect(resolvePath(after, '/v1.2.4')).toBe('1.2.4')
    expect(resolvePath(after, '/v1.2')).toBe('1.2.4')
    expect(resolvePath(after, '/v1')).toBe('1.2.4')
    expect(resolvePath(after, '/')).toBe('1.2.4')
  })

  it('a patch may skip numbers', () => {
    expect(applyDeploy(['1.2.3'], '1.2.9')).toEqual(['1.2.9'])
  })

  it('a version that is no string (a number read from JSON) is refused with DeployRefusedError naming it, not a TypeError of semver\'s', () => {
    expect(() => applyDeploy(['1.0.0'], 1 as never)).toThrow(new DeployRefusedError('1', 'a version must be a string <major>.<minor>.<patch>, not 1'))
    expect(() => applyDeploy(['1.0.0'], null as never)).toThrow(DeployRefusedError)
  })

  it('a lower or equal patch is refused with DeployRefusedError', () => {
    expect(() => applyDeploy(['1.2.3'], '1.2.2')).toThrow(DeployRefusedError)
    expect(() => applyDeploy(['1.2.3'], '1.2.3')).toThrow(DeployRefusedError)
    try {
      applyDeploy(['1.2.3'], '1.2.0')
      expect.unreachable()
    } catch (error) {
      expect(error).toBeInstanceOf(DeployRefusedError)
      const refused = error as DeployRefusedError
      expect(refused.version).toBe('1.2.0')
      expect(refused.code).toBe('ERR_DEPLOY_REFUSED')
      expect(refused.status).toBe(409)
      expect(refused.message).toContain('1.2.3')
    }
  })

  it('refuses a version too long to reach at its exact URL, and pre-release numbers that would not order exactly (regression)', () => {
    const longest = `1.1.0-${'a'.repeat(MAX_VERSION_LENGTH - 6)}`
    expect(applyDeploy([], longest)).toEqual([longest])
    expect(parseVersionPath(`/v${longest}/`)).toEqual({ kind: 'exact', version: longest })
    expect(() => applyDeploy([], `${longest}a`)).toThrow(DeployRefusedError)
    expect(() => applyDeploy(['1.2.0-9007199254740991'], '1.2.0-9007199254740992')).toThrow(/at most 9007199254740991/)
    expect(applyDeploy(['1.2.0-9007199254740990'], '1.2.0-9007199254740991')).toEqual(['1.2.0-9007199254740991'])
    // Valid SemVer that semver cannot read: said as such, not as "not a semantic version".
    for (const version of ['9007199254740992.0.0', '1.9007199254740992.0', '1.2.99999999999999999999-rc.1']) {
      expect(() => applyDeploy([], version), version).toThrow('major, minor and patch must be at most 9007199254740991')
    }
    expect(applyDeploy([], '9007199254740991.0.0')).toEqual(['9007199254740991.0.0'])
    expect(() => applyDeploy([], '01.2.3')).toThrow('is not a semantic version')
    // A leading zero is what refuses it, however large the number: not said to be too large.
    expect(() => applyDeploy([], '09007199254740992.0.0')).toThrow('is not a semantic version')
    expect(() => applyDeploy([], '1.2.09007199254740992-rc.1')).toThrow('is not a semantic version')
  })

  it('a new minor or major coexists with the others', () => {
    const live = deployAll(['1.2.3', '1.3.0', '2.0.0', '1.1.7'])
    expect(live).toEqual(['1.1.7', '1.2.3', '1.3.0', '2.0.0'])
    expect(resolvePath(live, '/v1')).toBe('1.3.0')
    expect(resolvePath(live, '/v1.1')).toBe('1.1.7')
    expect(resolvePath(live, '/')).toBe('2.0.0')
  })

  it('a new patch in one minor leaves the other minors alone', () => {
    expect(applyDeploy(['1.1.0', '1.2.0', '2.0.0'], '1.1.1')).toEqual(['1.1.1', '1.2.0', '2.0.0'])
  })

  it('a patch of an older minor is accepted (hotfix of a supported line)', () => {
    const live = deployAll(['1.1.0', '1.2.0', '1.1.1'])
    expect(live).toEqual(['1.1.1', '1.2.0'])
    expect(resolvePath(live, '/v1')).toBe('1.2.0')
  })

  describe('pre-releases', () => {
    it('live beside the release of its minor, reachable only exactly', () => {
      const live = applyDeploy(['1.2.3'], '1.2.4-rc.1')
      expect(live).toEqual(['1.2.3', '1.2.4-rc.1'])
      expect(resolvePath(live, '/v1.2.4-rc.1')).toBe('1.2.4-rc.1')
      expect(resolvePath(live, '/v1.2')).toBe('1.2.3')
      expect(resolvePath(live, '/v1')).toBe('1.2.3')
      expect(resolvePath(live, '/')).toBe('1.2.3')
    })

    it('a pre-release of a new major is never picked by broader URLs', () => {
      const live = applyDeploy(['1.2.3'], '2.0.0-rc.1')
      expect(resolvePath(live, '/')).toBe('1.2.3')
      expect(resolvePath(live, '/v2')).toBeNull()
      expect(resolvePath(live, '/v2.0')).toBeNull()
      expect(resolvePath(live, '/v2.0.0-rc.1')).toBe('2.0.0-rc.1')
    })

    it('a newer pre-release replaces the older pre-release of its minor', () => {
      const live = deployAll(['1.2.3', '1.2.4-rc.1', '1.2.4-rc.2'])
      expect(live).toEqual(['1.2.3', '1.2.4-rc.2'])
      expect(resolvePath(live, '/v1.2.4-rc.1')).toBeNull()
    })

    it('the release replaces its pre-releases and the older release', () => {
      const live = deployAll(['1.2.3', '1.2.4-rc.2', '1.2.4'])
      expect(live).toEqual(['1.2.4'])
      expect(resolvePath(live, '/v1.2.4-rc.2')).toBeNull()
    })

    it('a pre-release must be above the release of its minor', () => {
      expect(() => applyDeploy(['1.2.3'], '1.2.3-rc.1')).toThrow(DeployRefusedError)
      expect(() => applyDeploy(['1.2.3'], '1.2.2-rc.1')).toThrow(DeployRefusedError)
    })

    it('a pre-release must be above the live pre-release of its minor', () => {
      expect(() => applyDeploy(['1.2.4-rc.2'], '1.2.4-rc.1')).toThrow(DeployRefusedError)
      expect(() => applyDeploy(['1.2.4-rc.2'], '1.2.4-rc.2')).toThrow(DeployRefusedError)
    })

    it('a hotfix release may land below a live pre-release, which stays live', () => {
      const live = deployAll(['1.2.3', '1.2.5-rc.1', '1.2.4'])
      expect(live).toEqual(['1.2.4', '1.2.5-rc.1'])
      expect(resolvePath(live, '/v1.2')).toBe('1.2.4')
    })

    it('a release retires the pre-releases of its minor at or below it', () => {
      expect(deployAll(['1.2.4-rc.1', '1.2.4'])).toEqual(['1.2.4'])
      expect(deployAll(['1.2.4-rc.1', '1.2.5'])).toEqual(['1.2.5'])
    })
  })

  it('invalid versions are refused', () => {
    for (const bad of ['', '1', '1.2', 'v1.2.3', '=1.2.3', ' 1.2.3', '1.2.3 ', '01.2.3', '1.2.3+build', '1.2.3-rc.1+b', '1.2.3.4', 'latest', 'x.y.z']) {
      expect(() => applyDeploy(['1.0.0'], bad), JSON.stringify(bad)).toThrow(DeployRefusedError)
    }
  })

  it('a live set no sequence of deploys leaves (two releases of a minor, a pre-release at or below its release, a duplicate) is never kept: a RangeError, so an older patch cannot stay reachable (regression: kept)', () => {
    for (const live of [['1.0.0', '1.0.1'], ['1.0.0', '1.0.0'], ['1.0.1-rc.1', '1.0.1'], ['1.0.0-rc.1', '1.0.0-rc.2'], ['1.0.1', '1.0.0', '3.0.0']]) {
      expect(() => applyDeploy(live, '2.0.0'), live.join()).toThrow(RangeError)
      expect(() => applyDeploy(live, '1.1.0-rc.1'), live.join()).toThrow(RangeError)
    }
    expect(() => applyDeploy(['1.0.0', '1.0.0'], '2.0.0')).toThrow('"1.0.0" beside "1.0.0"')
    // A release of the minor replaces all of them, which puts the set right.
    expect(applyDeploy(['1.0.0', '1.0.1', '2.0.0'], '1.0.2')).toEqual(['1.0.2', '2.0.0'])
    expect(applyDeploy(['1.0.0-rc.1', '1.0.0-rc.2'], '1.0.0')).toEqual(['1.0.0'])
    // Sets the rule produces are kept as they are.
    expect(applyDeploy(['1.0.0', '1.0.2-rc.1', '1.1.0'], '2.0.0')).toEqual(['1.0.0', '1.0.2-rc.1', '1.1.0', '2.0.0'])
    expect(applyDeploy(['1.0.0', '1.0.2-rc.1'], '1.0.1')).toEqual(['1.0.1', '1.0.2-rc.1'])
  })

  it('an entry compileVersions refuses is never kept: a RangeError when the deploy would keep it (regression: kept), dropped when the deploy replaces it', () => {
    for (const bad of ['v1.0.0', ' 1.1.0', '1.2.0+b', '=1.3.0', 'x']) {
      expect(() => compileVersions([bad]), bad).toThrow(RangeError)
      expect(() => applyDeploy([bad], '2.0.0'), bad).toThrow(RangeError)
    }
    // A deploy in its minor puts such a set right, as a deploy replacing the version it spells would.
    expect(applyDeploy(['v1.0.0'], '1.0.1')).toEqual(['1.0.1'])
    expect(applyDeploy(['1.2.0+b', '2.0.0'], '1.2.1')).toEqual(['1.2.1', '2.0.0'])
    expect(() => applyDeploy(['v1.0.0'], '1.0.1-rc.1'), 'a pre-release keeps the release').toThrow(RangeError)
    expect(() => applyDeploy(['x'], '1.0.1')).toThrow(RangeError)
    // Whatever the deploy: refused, or a set that compiles.
    for (const bad of ['v1.0.0', ' 1.1.0', '1.2.0+b', '=1.3.0', 'v1.0.0-rc.1']) {
      for (const version of ['1.0.0', '1.0.1', '1.0.1-rc.1', '1.1.0', '1.2.1', '1.3.1', '2.0.0']) {
        let answer: string[] | undefined
        try {
          answer = applyDeploy([bad, '3.0.0'], version)
        } catch (error) {
          expect(error instanceof RangeError || error instanceof DeployRefusedError, `${bad} + ${version}`).toBe(true)
        }
        if (answer) expect(() => compileVersions(answer), `${bad} + ${version}`).not.toThrow()
      }
    }
  })

  it('a refused deploy leaves the live set as it was', () => {
    const live = ['1.2.3']
    expect(() => applyDeploy(live, '1.2.1')).toThrow(DeployRefusedError)
    expect(live).toEqual(['1.2.3'])
  })
})

describe('applyDeploy: what its refusal quotes', () => {
  it('quotes a version that is none, but not one that looks like a secret (a token pasted as the version)', () => {
    expect(() => applyDeploy([], 'one')).toThrow('"one" is not a semantic version')
    const secret = `svc_${'aB3'.repeat(12)}xY9Zq1`
    let message = ''
    try {
      applyDeploy(['1.0.0'], secret)
    } catch (error) {
      expect(error).toBeInstanceOf(DeployRefusedError)
      message = (error as Error).message
    }
    expect(message).toBe('[not shown: it looks like a secret] is not a semantic version <major>.<minor>.<patch>[-prerelease] without build metadata')
  })
})
