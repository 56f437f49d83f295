/**
 * The token API's paths: what each serves, read from the path alone. Its own module, free of
 * the API's body schemas (zod), for the Node adapters, which answer a method no web `Request`
 * can carry (`TRACE`) themselves.
 * @internal
 * @module
 */
import type { TokenApi } from './token-api.js'

/** What a Node adapter needs of an API `createTokenApi` made, beside the API itself. @internal */
export interface TokenApiTraits {
  /** Its `onError`, for what a Node adapter's hook reports on its behalf. */
  readonly report: (error: unknown, context: string) => void
  /** Whether `request` is its own (under its `basePath`, on its `hosts`): whether it answers other than `null`. */
  readonly owns: (request: Request) => boolean
}

const traits = new WeakMap<TokenApi, TokenApiTraits>()

/** Records what the Node adapters need of `api` (at its creation). @internal */
export function setTokenApiTraits(api: TokenApi, of: TokenApiTraits): void {
  traits.set(api, of)
}

/** `api`'s `onError`, or `undefined` for a handler `createTokenApi` did not make. @internal */
export function tokenApiReporter(api: TokenApi): ((error: unknown, context: string) => void) | undefined {
  return traits.get(api)?.report
}

/**
 * Whether `request` is `api`'s, for a method the Node adapters answer without asking it
 * (`TRACE`): a request the API would answer `null` (a host outside its `hosts`, or a Host that
 * moved the path) is not, whatever the method. For a handler `createTokenApi` did not make,
 * which cannot be asked without being served, its path alone decides.
 * @internal
 */
export function tokenApiOwns(api: TokenApi, request: Request): boolean {
  const owns = traits.get(api)?.owns
  return owns !== undefined ? owns(request) : isUnderBasePath(new URL(request.url).pathname, api.basePath)
}

/** Whether a URL path is `basePath` or under it (`/api/tokens/x`, not `/api/tokens-old`). @internal */
export function isUnderBasePath(path: string, basePath: string): boolean {
  return path === basePath || path.startsWith(`${basePath}/`)
}

/** A path segment with its percent-encoding undone; as it is when that is not valid. */
function decodeSegment(segment: string): string {
  try {
    return decodeURIComponent(segment)
  } catch {
    return segment
  }
}

/** What a path of the API serves (as a set, and as its `Allow`), and the message of its 405 for another method. */
export interface Served {
  readonly methods: ReadonlySet<string>
  readonly allow: string
  readonly message: string
}
/** The {@link Served} of `methods`, its `Allow` and 405 message written from them once. */
function servedFor(...methods: string[]): Served {
  const last = methods.at(-1)!
  const message = methods.length === 1 ? `Use ${last}` : `Use ${methods.slice(0, -1).join(', ')} or ${last}`
  return { methods: new Set(methods), allow: methods.join(', '), message }
}
const COLLECTION = servedFor('GET', 'HEAD', 'POST')
const ITEM = servedFor('GET', 'HEAD', 'PATCH', 'DELETE')
const ROTATION = servedFor('POST')

/**
 * The methods the API serves at `pathname` (a request's URL path, under `basePath`), or the
 * message of the 404 it answers there. For the Node adapters, which answer a method no web
 * `Request` can carry (`TRACE`) themselves, as the API answers a method it does not serve.
 * @internal
 */
export function tokenApiMethods(api: TokenApi, pathname: string): Served | string {
  return servedAt(segmentsOf(pathname.slice(api.basePath.length).replace(/\/$/, '')))
}

/** The segments of the path after `basePath`, percent-decoded. */
export function segmentsOf(rest: string): string[] {
  // Percent-encoded unreserved characters are the characters themselves (RFC 3986 section 6.2.2.2).
  return rest === '' ? [] : rest.slice(1).split('/').map(decodeSegment)
}

/** What `segments` (of the path after `basePath`) name, or the message of its 404. */
export function servedAt(segments: readonly string[]): Served | string {
  const [id, action] = segments
  if (segments.length > 2 || (action !== undefined && action !== 'rotate') || id === '') return 'Not found'
  if (id !== undefined && !TOKEN_ID.test(id)) return 'Token not found'
  return id === undefined ? COLLECTION : action === undefined ? ITEM : ROTATION
}

// 1 to 64 unreserved URL characters (RFC 3986 section 2.3), so an id a platform imported
// (`tok_imported_1`) is reached as the service's methods reach it; not `.` or `..`.
const TOKEN_ID = /^(?!\.\.?$)[A-Za-z0-9._~-]{1,64}$/

/** The API's answer to a method a path does not serve, or at a path naming nothing. */
export interface PathRefusal {
  readonly status: 404 | 405
  readonly body: { readonly error: string; readonly message: string }
  /** `Allow`, for a 405. */
  readonly allow?: string
}

/** What the API answers where `served` (of {@link servedAt}) says the request cannot be served. */
export function refusalAt(served: Served | string): PathRefusal {
  if (typeof served === 'string') return { status: 404, body: { error: 'not_found', message: served } }
  return { status: 405, body: { error: 'method_not_allowed', message: served.message }, allow: served.allow }
}
