/**
 * Version paths, resolution and the deploy rule (spec section 9, DESIGN.md "Versions").
 *
 * Resolution runs on every request, so the live set is compiled once into a
 * {@link VersionIndex} (highest version per major and per minor, the exact set) and each
 * lookup is a constant number of map reads, whatever the number of live versions.
 * @module
 */
import semver from 'semver'
import { DeployRefusedError } from '../errors.js'
import { kindOf, quoted } from './text.js'

/** What a request path asks for (spec 9.1). */
export type VersionSelector =
  | { readonly kind: 'latest' }
  | { readonly kind: 'major'; readonly major: number }
  | { readonly kind: 'minor'; readonly major: number; readonly minor: number }
  | { readonly kind: 'exact'; readonly version: string }

const LATEST: VersionSelector = Object.freeze({ kind: 'latest' })
const NUM = '(0|[1-9]\\d{0,15})'
const PRERELEASE_ID = '(?:0|[1-9]\\d*|\\d*[A-Za-z-][0-9A-Za-z-]*)'
const VERSION_PATH = new RegExp(
  `^/v${NUM}(?:\\.${NUM}(?:\\.${NUM}(-${PRERELEASE_ID}(?:\\.${PRERELEASE_ID})*)?)?)?/?$`,
)

/**
 * Parses the App-relative path of an MCP request: `/` (or empty), `/v<major>`,
 * `/v<major>.<minor>`, `/v<major>.<minor>.<patch>` and `/v<major>.<minor>.<patch>-<pre>`;
 * a trailing slash is tolerated. Leading zeros, build metadata and anything else give
 * `null` (404). Percent-encoded unreserved characters are decoded first (`/v%31` is `/v1`,
 * RFC 3986 section 6.2.2.2); any other escape, an encoded `/` among them, stays and gives `null`.
 *
 * @example
 * ```ts
 * parseVersionPath('/v1.2')  // { kind: 'minor', major: 1, minor: 2 }
 * parseVersionPath('/v1.x')  // null
 * ```
 */
export function parseVersionPath(path: string): VersionSelector | null {
  if (path.includes('%')) {
    if (path.length > 384) return null
    path = decodeUnreserved(path)
  }
  if (path === '' || path === '/') return LATEST
  if (path.length > 128 || path.charCodeAt(1) !== 118 /* v */) return null
  const m = VERSION_PATH.exec(path)
  if (!m) return null
  const major = Number(m[1])
  if (!Number.isSafeInteger(major)) return null
  if (m[2] === undefined) return { kind: 'major', major }
  const minor = Number(m[2])
  if (!Number.isSafeInteger(minor)) return null
  if (m[3] === undefined) return { kind: 'minor', major, minor }
  if (!Number.isSafeInteger(Number(m[3]))) return null
  return { kind: 'exact', version: `${m[1]}.${m[2]}.${m[3]}${m[4] ?? ''}` }
}

/** RFC 3986 unreserved characters: ALPHA / DIGIT / "-" / "." / "_" / "~". */
const UNRESERVED = /^[A-Za-z0-9._~-]$/

/** Decodes the percent-escapes of unreserved characters, the equivalent spelling (RFC 3986 6.2.2.2). */
function decodeUnreserved(path: string): string {
  return path.replace(/%([0-9A-Fa-f]{2})/g, (escape: string, hex: string) => {
    const char = String.fromCharCode(parseInt(hex, 16))
    return UNRESERVED.test(char) ? char : escape
  })
}

/**
 * Text of a selector as it appeared in the URL, without the `v` (`'1.2'`, `'latest'`).
 *
 * @example
 * ```ts
 * formatSelector(parseVersionPath('/v1.2')!) // '1.2'
 * formatSelector({ kind: 'latest' })          // 'latest'
 * ```
 */
export function formatSelector(selector: VersionSelector): string {
  switch (selector.kind) {
    case 'latest':
      return 'latest'
    case 'major':
      return String(selector.major)
    case 'minor':
      return `${selector.major}.${selector.minor}`
    case 'exact':
      return selector.version
  }
}

interface MajorLine {
  highest: string
  minors: Map<number, string>
}

/** A live set compiled for constant-time resolution. Build with {@link compileVersions}. */
export interface VersionIndex {
  /** The live versions, sorted ascending by semver precedence. */
  readonly live: readonly string[]
  /**
   * `X-MCP-Latest-Version`: the highest live release; when only pre-releases are live, the
   * highest of those; `null` when nothing is live.
   */
  readonly latest: string | null
  /** @internal */
  readonly majors: ReadonlyMap<number, MajorLine>
  /** @internal */
  readonly exact: ReadonlySet<string>
}

/**
 * Whether a version is a pre-release: a `-` before any build metadata (SemVer 2.0.0 rule 9).
 * Read without parsing, as it runs on every request of a session.
 * @internal
 */
export function isPreRelease(version: string): boolean {
  const dash = version.indexOf('-')
  if (dash === -1) return false
  const plus = version.indexOf('+')
  return plus === -1 || dash < plus
}

/**
 * Whether `value` is a version as the live sets hold them: `<major>.<minor>.<patch>`, maybe
 * with a pre-release, no build metadata, written exactly (no `v`, no spaces).
 * @internal
 */
export function isExactVersion(value: string): boolean {
  return spelledExactly(semver.parse(value), value)
}

/**
 * Whether `written` parsed (`p`) is a version as written: semver.parse cleans up a leading `v`
 * or spaces, which no URL names, and build metadata has no precedence to order deploys by.
 */
function spelledExactly(p: semver.SemVer | null, written: string): p is semver.SemVer {
  return p !== null && p.build.length === 0 && p.version === written
}

/** The `RangeError` of a live-set entry that is no version as written (a store must hold none). */
function notAVersion(v: string): RangeError {
  return new RangeError(`not a semantic version: ${JSON.stringify(v)}`)
}

/** An entry of a live set, parsed. */
function parseLive(v: string): semver.SemVer {
  const p = semver.parse(v)
  if (!spelledExactly(p, v)) throw notAVersion(v)
  return p
}

/**
 * Compiles a live set. Invalid entries throw a `RangeError` (a store must never hold one).
 *
 * @example
 * ```ts
 * const index = compileVersions(['1.0.3', '1.1.0', '2.0.0-rc.1'])
 * resolveVersion(index, { kind: 'major', major: 1 }) // '1.1.0'
 * index.latest                                       // '1.1.0'
 * ```
 */
export function compileVersions(live: readonly string[]): VersionIndex {
  const parsed = live.map(parseLive)
  parsed.sort(semver.compare)
  const majors = new Map<number, MajorLine>()
  let latestRelease: string | null = null
  for (const p of parsed) {
    if (p.prerelease.length > 0) continue
    const v = p.version
    latestRelease = v // ascending order: the last release wins
    let line = majors.get(p.major)
    if (!line) majors.set(p.major, (line = { highest: v, minors: new Map() }))
    line.highest = v
    line.minors.set(p.minor, v)
  }
  const sorted = parsed.map((p) => p.version)
  return {
    live: sorted,
    latest: latestRelease ?? sorted[sorted.length - 1] ?? null,
    majors,
    exact: new Set(sorted),
  }
}

/**
 * Resolves a selector against a compiled live set (spec 9.1, 9.2): exact → that version only
 * (never another); minor → highest live patch of the minor; major → highest live version of
 * the major; latest → highest live version. Pre-releases are reached only by exact URL.
 * `null` when nothing live matches (404). Constant time in the number of live versions.
 *
 * @example
 * ```ts
 * const index = compileVersions(['1.0.3', '1.1.2', '2.0.0-rc.1'])
 * resolveVersion(index, parseVersionPath('/')!)            // '1.1.2'
 * resolveVersion(index, parseVersionPath('/v1.0')!)        // '1.0.3'
 * resolveVersion(index, parseVersionPath('/v1.1.0')!)      // null: 404 version_not_found
 * resolveVersion(index, parseVersionPath('/v2')!)          // null: a pre-release only by its exact URL
 * resolveVersion(index, parseVersionPath('/v2.0.0-rc.1')!) // '2.0.0-rc.1'
 * ```
 */
export function resolveVersion(index: VersionIndex, selector: VersionSelector): string | null {
  switch (selector.kind) {
    case 'latest': {
      const latest = index.latest
      return latest !== null && index.majors.size > 0 ? latest : null
    }
    case 'major':
      return index.majors.get(selector.major)?.highest ?? null
    case 'minor':
      return index.majors.get(selector.major)?.minors.get(selector.minor) ?? null
    case 'exact':
      return index.exact.has(selector.version) ? selector.version : null
  }
}

/** The longest version a deploy takes: its exact URL (`/v` + version + `/`) fits the path limit. */
export const MAX_VERSION_LENGTH = 125

/**
 * The deploy rule of DESIGN.md as one pure function: (live set, new version) → new live set.
 *
 * - A release `x.y.z` replaces the live release of `x.y`; a release lower than or equal to
 *   it is refused. Live pre-releases of `x.y` at or below `x.y.z` are retired with it.
 *   A live pre-release above `x.y.z` stays live beside it.
 * - A pre-release `x.y.z-p` is live beside the release of its minor, replaces an older
 *   pre-release of that minor, and is refused when it is not above both.
 * - Build metadata is refused (`+build` has no precedence, so it cannot order deploys), as
 *   are versions longer than {@link MAX_VERSION_LENGTH} (unreachable by URL) and pre-release
 *   numbers past `Number.MAX_SAFE_INTEGER` (they would not order exactly).
 *
 * @throws {DeployRefusedError} naming the rule that refused it.
 * @throws {RangeError} when `live` holds an entry {@link compileVersions} refuses (a store
 *   must never hold one) that the deploy would keep: what this function answers always
 *   compiles. One the deploy replaces (`v1.0.0` by `1.0.1`) is dropped, as the version it spells.
 *   Also when the set it would answer is one no sequence of deploys leaves live (two releases
 *   or two pre-releases of a minor, a pre-release at or below the release of its minor, a
 *   version twice): a release
 *   of that minor replaces them all, which puts such a set right.
 * @example
 * ```ts
 * applyDeploy(['1.2.3'], '1.2.4') // ['1.2.4']
 * applyDeploy(['1.2.3'], '1.3.0') // ['1.2.3', '1.3.0']
 * applyDeploy(['1.2.3'], '1.2.2') // throws DeployRefusedError
 * ```
 */
export function applyDeploy(live: readonly string[], version: string): string[] {
  // A version read from JSON may be a number (`1`, `1.2`): named, not a TypeError of semver's.
  if (typeof version !== 'string') throw new DeployRefusedError(kindOf(version), `a version must be a string <major>.<minor>.<patch>, not ${kindOf(version)}`)
  const next = semver.parse(version)
  // semver refuses a major, minor or patch past 2^53 - 1 as no version at all: said as it is.
  const numbers = /^(\d+)\.(\d+)\.(\d+)(?:-[0-9A-Za-z.-]+)?$/.exec(version)
  if (next === null && numbers !== null && numbers.slice(1).some((n) => !/^0\d/.test(n) && !Number.isSafeInteger(Number(n)))) {
    throw new DeployRefusedError(version, `major, minor and patch must be at most ${Number.MAX_SAFE_INTEGER}`)
  }
  if (!spelledExactly(next, version)) {
    throw new DeployRefusedError(
      version,
      `${quoted(version)} is not a semantic version <major>.<minor>.<patch>[-prerelease] without build metadata`,
    )
  }
  // Reachable: a version path is at most 128 characters (`/v` and the version, maybe a `/`).
  if (version.length > MAX_VERSION_LENGTH) {
    throw new DeployRefusedError(version, `a version is at most ${MAX_VERSION_LENGTH} characters, to be reachable at its exact URL`)
  }
  // Ordered exactly: semver compares numeric identifiers as JavaScript numbers.
  if (next.prerelease.some((id) => /^\d+$/.test(String(id)) && !Number.isSafeInteger(Number(id)))) {
    throw new DeployRefusedError(version, `pre-release numbers must be at most ${Number.MAX_SAFE_INTEGER}`)
  }
  const isPre = next.prerelease.length > 0
  const kept: string[] = []
  for (const v of live) {
    const p = semver.parse(v)
    if (!p) throw notAVersion(v)
    // An entry `compileVersions` refuses (`v1.0.0`, `1.2.0+b`: what a store of the platform's
    // own was given elsewhere) is never kept, so the answer always compiles; it may be
    // replaced, as the version it spells, which is how such a set is put right.
    const keep = () => {
      if (!spelledExactly(p, v)) throw notAVersion(v)
      kept.push(v)
    }
    const sameMinor = p.major === next.major && p.minor === next.minor
    if (!sameMinor) {
      keep()
      continue
    }
    const livePre = p.prerelease.length > 0
    if (semver.gte(p, next)) {
      // A hotfix release may land below a pre-release already live in its minor.
      if (!isPre && livePre) {
        keep()
        continue
      }
      throw new DeployRefusedError(
        version,
        `cannot deploy ${version}: ${v} is live in ${next.major}.${next.minor} and a deploy must be higher than it`,
      )
    }
    // Lower than the new version: a release is replaced by a release; a pre-release is
    // replaced by anything newer in its minor. A live release survives a newer pre-release.
    if (isPre && !livePre) keep()
  }
  kept.push(version)
  kept.sort(semver.compare)
  checkReachable(kept)
  return kept
}

/**
 * Throws the `RangeError` of a set no sequence of deploys leaves live (a store of the platform's
 * own given it elsewhere): per minor, one release at most, and one pre-release at most, above it.
 * An older patch kept beside a newer one would stay reachable at its exact URL, which the rule
 * takes away (DESIGN.md "Versions"). `sorted` holds versions as written, in ascending order.
 */
function checkReachable(sorted: readonly string[]): void {
  let release: semver.SemVer | undefined
  let pre: semver.SemVer | undefined
  for (const v of sorted) {
    const p = semver.parse(v)!
    const sameMinor = (q: semver.SemVer | undefined) => q !== undefined && q.major === p.major && q.minor === p.minor
    const twice = p.prerelease.length > 0 ? (sameMinor(pre) ? pre : undefined) : sameMinor(release) ? release : sameMinor(pre) ? pre : undefined
    if (twice !== undefined) {
      throw new RangeError(
        `the live set holds ${JSON.stringify(twice.version)} beside ${JSON.stringify(v)}, which no sequence of deploys leaves live together (one release and one pre-release above it per minor): a store must hold only what applyDeploy answers`,
      )
    }
    if (p.prerelease.length > 0) pre = p
    else release = p
  }
}
