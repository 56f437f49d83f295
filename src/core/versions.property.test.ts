import fc from 'fast-check'
import semver from 'semver'
import { describe, expect, it } from 'vitest'
import { DeployRefusedError } from '../errors.js'
import {
  type VersionSelector,
  applyDeploy,
  compileVersions,
  formatSelector,
  parseVersionPath,
  resolveVersion,
} from './versions.js'

const RUNS = { numRuns: 500 }

const anyPath = fc.oneof(
  fc.string({ unit: 'binary', maxLength: 60 }),
  fc.string({ maxLength: 60 }).map((s) => `/v${s}`),
  fc.string({ unit: fc.constantFrom('/', 'v', 'V', '0', '1', '2', '9', '.', '-', '+', 'r', 'c', 'x', ' '), maxLength: 30 }),
)

// Selectors whose URL text stays under the parser's 128-character bound.
const num = fc.oneof(fc.nat(20), fc.maxSafeNat())
const preId = fc.oneof(
  fc.nat(1000).map(String),
  fc.stringMatching(/^[0-9]{0,2}[A-Za-z-][0-9A-Za-z-]{0,6}$/),
)
const selector: fc.Arbitrary<VersionSelector> = fc.oneof(
  fc.constant({ kind: 'latest' as const }),
  num.map((major) => ({ kind: 'major' as const, major })),
  fc.tuple(num, num).map(([major, minor]) => ({ kind: 'minor' as const, major, minor })),
  fc
    .tuple(num, num, num, fc.array(preId, { maxLength: 3 }))
    .map(([a, b, c, pre]) => ({
      kind: 'exact' as const,
      version: `${a}.${b}.${c}${pre.length > 0 ? `-${pre.join('.')}` : ''}`,
    })),
)

function pathOf(s: VersionSelector): string {
  return s.kind === 'latest' ? '/' : `/v${formatSelector(s)}`
}

describe('version paths, property-based', () => {
  it('arbitrary paths never throw, and every accepted path gives a well-formed selector', () => {
    fc.assert(
      fc.property(anyPath, (path) => {
        const s = parseVersionPath(path)
        if (s === null) return
        switch (s.kind) {
          case 'latest':
            expect(['', '/']).toContain(path)
            break
          case 'major':
            expect(Number.isSafeInteger(s.major) && s.major >= 0).toBe(true)
            break
          case 'minor':
            expect(Number.isSafeInteger(s.major) && Number.isSafeInteger(s.minor)).toBe(true)
            break
          case 'exact':
            // The text is exactly what semver calls it, so an exact URL can match a live version.
            expect(semver.parse(s.version)?.version).toBe(s.version)
            break
        }
      }),
      RUNS,
    )
  })

  it('formatting a valid selector and parsing it again round-trips (with or without a trailing slash)', () => {
    fc.assert(
      fc.property(selector, fc.boolean(), (s, slash) => {
        const path = pathOf(s)
        fc.pre(path.length < 128)
        expect(parseVersionPath(path)).toEqual(s)
        if (s.kind !== 'latest' && slash) expect(parseVersionPath(`${path}/`)).toEqual(s)
        if (s.kind === 'exact') expect(semver.parse(s.version)?.version).toBe(s.version)
      }),
      RUNS,
    )
  })

  it('percent-encoded unreserved characters are the characters themselves: any of a version path\'s characters encoded (either hex case) parse as written plain, within 384 characters', () => {
    const hex = (c: string, upper: boolean) => `%${c.charCodeAt(0).toString(16).padStart(2, '0')[upper ? 'toUpperCase' : 'toLowerCase']()}`
    fc.assert(
      fc.property(selector.filter((s) => s.kind !== 'latest'), fc.boolean(), fc.infiniteStream(fc.tuple(fc.boolean(), fc.boolean())), (s, slash, draws) => {
        const plain = `${pathOf(s)}${slash ? '/' : ''}`
        const picks = [...draws.take(plain.length)]
        // Every character but the leading `/` is unreserved (digits, letters, `.`, `-`).
        const encoded = [...plain].map((c, i) => (i > 0 && c !== '/' && picks[i]![0] ? hex(c, picks[i]![1]) : c)).join('')
        expect(parseVersionPath(encoded)).toEqual(encoded.length > 384 ? null : parseVersionPath(plain))
      }),
      RUNS,
    )
  })

  it('an escape of what is not unreserved (an encoded /, +, space, %, a byte past ASCII) or no escape at all (%G1) stays, and the path is no version path', () => {
    const reserved = fc.constantFrom('%2F', '%2f', '%2B', '%20', '%25', '%2531', '%3A', '%40', '%C3%A9', '%00', '%7F', '%G1', '%E2%80%8B')
    fc.assert(
      fc.property(selector.filter((s) => s.kind !== 'latest'), reserved, fc.nat(), (s, escape, at) => {
        const plain = pathOf(s)
        const i = 1 + (at % plain.length)
        expect(parseVersionPath(`${plain.slice(0, i)}${escape}${plain.slice(i)}`)).toBeNull()
      }),
      RUNS,
    )
    expect(parseVersionPath('%2F')).toBeNull()
    expect(parseVersionPath('/v%31')).toEqual({ kind: 'major', major: 1 })
  })

  it('build metadata and leading zeros never parse', () => {
    fc.assert(
      fc.property(fc.nat(99), fc.nat(99), fc.nat(99), fc.stringMatching(/^[0-9A-Za-z]{1,6}$/), (a, b, c, build) => {
        expect(parseVersionPath(`/v${a}.${b}.${c}+${build}`)).toBeNull()
        expect(parseVersionPath(`/v0${a}.${b}`)).toBeNull()
        expect(parseVersionPath(`/v${a}.0${b}`)).toBeNull()
      }),
      { numRuns: 200 },
    )
  })
})

// --- The versions rule over random deploy sequences -------------------------------------

const PRE = ['alpha', 'alpha.1', 'beta', 'rc.1', 'rc.2', 'rc.10', '0', '1']
// Components of one and of several digits, so the order of the text (`10` before `9`, `100`
// before `11` before `2`) is never the order of the versions: with one digit each, a live set
// sorted as strings would be sorted right. Few majors and minors, so deploys often meet a live
// version of their minor (replacements and refusals); more patches, which only order within one.
const MAJORS = [0, 1, 9, 10] as const
const MINORS = [0, 2, 9, 10] as const
const PATCHES = [0, 1, 2, 9, 10, 11, 100] as const
const release = fc
  .tuple(fc.constantFrom(...MAJORS), fc.constantFrom(...MINORS), fc.constantFrom(...PATCHES))
  .map(([a, b, c]) => `${a}.${b}.${c}`)
const deployable = fc.oneof(
  { weight: 6, arbitrary: release },
  { weight: 3, arbitrary: fc.tuple(release, fc.constantFrom(...PRE)).map(([v, p]) => `${v}-${p}`) },
  { weight: 1, arbitrary: fc.constantFrom('1.2', 'v1.0.0', '1.0.0+build', '01.0.0', '', 'latest', '1.0.0-rc.01') },
)

const minorKey = (v: string) => `${semver.major(v)}.${semver.minor(v)}`
const isPre = (v: string) => semver.prerelease(v) !== null
const maxOf = (versions: readonly string[]) =>
  versions.length === 0 ? null : versions.reduce((best, v) => (semver.gt(v, best) ? v : best))

/** What DESIGN.md says a deploy must do, written independently of applyDeploy. */
function expectedRefusal(live: readonly string[], v: string): boolean {
  const p = semver.parse(v)
  if (!p || p.version !== v || p.build.length > 0) return true
  const sameMinor = live.filter((l) => minorKey(l) === minorKey(v))
  const release = sameMinor.find((l) => !isPre(l))
  const pre = sameMinor.find(isPre)
  if (release !== undefined && semver.gte(release, v)) return true
  if (isPre(v) && pre !== undefined && semver.gte(pre, v)) return true
  return false
}

function checkResolution(live: readonly string[], everDeployed: ReadonlySet<string>): void {
  const index = compileVersions(live)
  const releases = live.filter((v) => !isPre(v))
  expect(resolveVersion(index, { kind: 'latest' })).toBe(maxOf(releases))
  if (releases.length > 0) expect(index.latest).toBe(maxOf(releases))
  // Every major and minor a deploy can name, and one none can (1 as a minor, 2 as a major):
  // lines with nothing live resolve to nothing.
  for (const major of [...MAJORS, 2]) {
    const inMajor = releases.filter((v) => semver.major(v) === major)
    expect(resolveVersion(index, { kind: 'major', major })).toBe(maxOf(inMajor))
    for (const minor of [...MINORS, 1]) {
      const inMinor = inMajor.filter((v) => semver.minor(v) === minor)
      expect(resolveVersion(index, { kind: 'minor', major, minor })).toBe(maxOf(inMinor))
    }
  }
  for (const v of everDeployed) {
    expect(resolveVersion(index, { kind: 'exact', version: v })).toBe(live.includes(v) ? v : null)
  }
}

describe('the versions rule, property-based (DESIGN.md "Versions")', () => {
  it('for any deploy sequence, resolution gives the highest live version of the line, never a replaced one or a pre-release', () => {
    fc.assert(
      fc.property(fc.array(deployable, { maxLength: 40 }), (sequence) => {
        let live: readonly string[] = []
        const everLive = new Set<string>()
        const replaced = new Set<string>()
        const bestOfMinor = new Map<string, string>()
        // The live set as docs/versions.md states the rule, kept apart from applyDeploy: per
        // minor, its release, and a pre-release above it.
        const model = new Map<string, { release?: string; pre?: string }>()
        for (const v of sequence) {
          const refuse = expectedRefusal(live, v)
          let next: string[]
          try {
            next = applyDeploy(live, v)
          } catch (error) {
            expect(error).toBeInstanceOf(DeployRefusedError)
            expect((error as DeployRefusedError).version).toBe(v)
            expect(refuse, `refused ${v} over ${live.join(',')}`).toBe(true)
            continue
          }
          expect(refuse, `accepted ${v} over ${live.join(',')}`).toBe(false)
          for (const old of live) if (!next.includes(old)) replaced.add(old)
          live = next
          everLive.add(v)

          const minor = model.get(minorKey(v)) ?? {}
          if (isPre(v)) minor.pre = v
          else {
            minor.release = v
            // A pre-release at or below the new release is retired with the old release.
            if (minor.pre !== undefined && semver.lte(minor.pre, v)) delete minor.pre
          }
          model.set(minorKey(v), minor)
          const modelled = [...model.values()].flatMap((m) => [m.release, m.pre].filter((x): x is string => x !== undefined))
          expect(live, `after ${v}`).toEqual(modelled.sort(semver.compare))

          // The live set: sorted, unique, at most one release and one pre-release per minor.
          expect(live).toContain(v)
          expect([...live].sort(semver.compare)).toEqual(live)
          expect(new Set(live).size).toBe(live.length)
          const seen = new Set<string>()
          for (const l of live) {
            const key = `${minorKey(l)}${isPre(l) ? '-pre' : ''}`
            expect(seen.has(key), `two of ${key} in ${live.join(',')}`).toBe(false)
            seen.add(key)
          }
          // Only versions of the deployed minor are ever retired, and a replaced version never comes back.
          for (const old of replaced) {
            expect(live).not.toContain(old)
          }
          // A deployed release is what its minor resolves to from now on; a minor's release only rises.
          if (!isPre(v)) {
            const index = compileVersions(live)
            expect(resolveVersion(index, { kind: 'minor', major: semver.major(v), minor: semver.minor(v) })).toBe(v)
          }
          for (const l of live) {
            if (isPre(l)) continue
            const before = bestOfMinor.get(minorKey(l))
            if (before !== undefined) expect(semver.gte(l, before)).toBe(true)
            bestOfMinor.set(minorKey(l), l)
          }
          for (const key of bestOfMinor.keys()) {
            expect(live.some((l) => !isPre(l) && minorKey(l) === key), `${key} lost its release`).toBe(true)
          }
          checkResolution(live, everLive)
        }
      }),
      RUNS,
    )
  })

  it('a deploy changes only the minor it belongs to', () => {
    fc.assert(
      fc.property(fc.array(deployable, { maxLength: 25 }), deployable, (sequence, v) => {
        let live: string[] = []
        for (const s of sequence) {
          try {
            live = applyDeploy(live, s)
          } catch {
            // refused deploys are part of the sequence
          }
        }
        let next: string[]
        try {
          next = applyDeploy(live, v)
        } catch {
          return
        }
        const others = (set: readonly string[]) => set.filter((l) => minorKey(l) !== minorKey(v))
        expect(others(next)).toEqual(others(live))
      }),
      RUNS,
    )
  })
})
