/**
 * Pieces every adapter shares: building the dispatcher from options, the neutral request,
 * and the replies for handler failures. Adapters translate; no rule lives here.
 * Not an entry point: the adapters' entries export what users need of it.
 * @module
 */
import { type CompiledTrustProxy, type TrustProxy, compileTrustProxy } from '../core/client-address.js'
import type { TokenApi } from '../tokens/token-api.js'
import { type Reply, RpcCode, invalidHostReply, jsonRpcErrorReply } from '../core/reply.js'
import { ConfigurationError, optionNames, refuseUnknownOptions, reporterOption, requireMethods } from '../errors.js'
import { DISPATCHER_OPTIONS, type Dispatcher, type DispatcherOptions, createDispatcher, dispatcherReporter } from '../pipeline/dispatcher.js'
import { PROTECTED_RESOURCE_METADATA_PATH } from '../core/metadata.js'
import { withoutTrailingSlashes } from '../core/trailing-slash.js'
import { parseVersionPath } from '../core/versions.js'

/** Options every adapter accepts. */
export interface AdapterOptions {
  /** A dispatcher, or the options to create one. */
  dispatcher: Dispatcher | DispatcherOptions
  /**
   * Which proxies may set `X-Forwarded-For` (default `false`: the header is ignored and the
   * socket address is the client address). On the Web adapter, a request whose socket peer
   * (`info.clientAddress`) is trusted so may also set the scheme of the App address with
   * `X-Forwarded-Proto` (`http` or `https`); Express and Fastify take the scheme from
   * `req.protocol`, which follows their own `trust proxy` and `trustProxy` settings.
   */
  trustProxy?: TrustProxy | undefined
  /**
   * Called with handler failures and other errors the client only sees as a status. Default:
   * the `onError` of a `dispatcher` made by `createDispatcher` (which reports there its own
   * failures too), else `logError` (stderr).
   */
  onError?: ((error: unknown, context: string) => void) | undefined
}

const ADAPTER_OPTIONS = optionNames<AdapterOptions>({ dispatcher: true, trustProxy: true, onError: true })

/**
 * Which adapter is set up: its name in messages, the options of its own beside
 * {@link AdapterOptions}, and where an option it does not take goes.
 * @internal
 */
export interface AdapterKind {
  name: string
  options?: readonly string[]
  elsewhere?: (key: string) => string | undefined
}

/** Where a dispatcher's option given to an adapter goes. */
function dispatcherOption(key: string): string | undefined {
  return DISPATCHER_OPTIONS.includes(key) && key !== 'onError'
    ? `it is one of the dispatcher's, given in it: mcpDispatch({ dispatcher: { apps, subscriptions, tokens, ${key}, … } })`
    : undefined
}

/** @internal */
export function setupAdapter(
  options: AdapterOptions,
  kind: AdapterKind,
): {
  dispatcher: Dispatcher
  trust: CompiledTrustProxy
  onError: (error: unknown, context: string) => void
} {
  if (options == null) throw new ConfigurationError('dispatcher', 'is required')
  if (typeof options !== 'object') throw new ConfigurationError('options', 'must be an object with a dispatcher')
  refuseUnknownOptions(options, [...ADAPTER_OPTIONS, ...(kind.options ?? [])], `${kind.name}'s mcpDispatch`, (key) => dispatcherOption(key) ?? kind.elsewhere?.(key))
  const given: unknown = options.dispatcher
  if (given == null) throw new ConfigurationError('dispatcher', 'is required')
  if (typeof given !== 'object') throw new ConfigurationError('dispatcher', 'must be a Dispatcher (createDispatcher) or the options of one')
  let onError = reporterOption(options.onError)
  // Built here from options: the dispatcher's own failures (stores, session pins) go to the
  // adapter's `onError` too, unless the options name a reporter of their own. A dispatcher
  // lends its own `onError` to an adapter given none: a platform that set it on
  // `createDispatcher`, or in the dispatcher's options, hears its handlers' failures there
  // too, not on stderr.
  let dispatcher: Dispatcher
  if ('decide' in given) {
    requireMethods('dispatcher', given, 'a Dispatcher (createDispatcher)', ['decide'])
    dispatcher = given as Dispatcher
  } else dispatcher = createDispatcher({ ...(options.onError && { onError: options.onError }), ...(given as DispatcherOptions) })
  if (options.onError === undefined) onError = dispatcherReporter(dispatcher) ?? onError
  let trust: CompiledTrustProxy
  try {
    trust = compileTrustProxy(options.trustProxy)
  } catch (error) {
    throw trustProxyError(error)
  }
  return { dispatcher, trust, onError }
}

/**
 * Answer when the App's handler throws or fails before sending a response: the dispatch
 * layer is a gateway in front of the App, so 502, with no detail of the failure.
 */
export const HANDLER_FAILED: Reply = jsonRpcErrorReply(502, {
  code: RpcCode.InternalError,
  message: 'App handler failed',
  data: { error: 'handler_error' },
})

/**
 * Answer for the server's own fault: a failure of the platform's code or wiring (a route that
 * threw, a runtime's object where the adapter takes a string). 500, never a 503 a client would
 * retry: nothing comes of retrying until the platform is mended. No detail of the failure.
 */
export const INTERNAL_ERROR: Reply = jsonRpcErrorReply(500, { code: RpcCode.InternalError, message: 'Internal error' })

/**
 * Tells `onError` (context `configuration`), once, that a request decided by one dispatcher met
 * `where` (the middleware of another), and answers what the request gets: a 500. The second
 * would otherwise pass it on unchecked by its own stores (a subscription there refused, a limit
 * there spent), nor can it decide again over the first's pin and headers. Once: every request
 * of the route would repeat it.
 */
export function secondDispatcherRefusal(onError: (error: unknown, context: string) => void, where: string): () => Reply {
  let told = false
  return () => {
    if (!told) {
      told = true
      onError(
        new ConfigurationError(
          'dispatcher',
          `a request decided by one dispatcher met ${where} of another: a request may meet one dispatcher only (give each its own paths or hosts, or use one whose stores answer for both); answered 500`,
        ),
        'configuration',
      )
    }
    return INTERNAL_ERROR
  }
}

/**
 * Splits an absolute URL into origin (`scheme://host`) and path (no query, no fragment). The
 * host ends at the first `/`, `?` or `#`; a URL without a path (`http://host?q`) has the path `/`.
 */
export function splitUrl(url: string): { origin: string; path: string } {
  const schemeEnd = url.indexOf('://')
  const hostStart = schemeEnd === -1 ? 0 : schemeEnd + 3
  const slash = url.indexOf('/', hostStart)
  const query = url.indexOf('?', hostStart)
  const hash = url.indexOf('#', hostStart)
  // The path ends at the query or the fragment, whichever comes first; the host at either or at the path.
  let pathEnd = url.length
  if (query !== -1) pathEnd = query
  if (hash !== -1 && hash < pathEnd) pathEnd = hash
  const hostEnd = slash !== -1 && slash < pathEnd ? slash : pathEnd
  return { origin: url.slice(0, hostEnd), path: hostEnd === pathEnd ? '/' : url.slice(hostEnd, pathEnd) }
}

/**
 * 400 for a request whose `Host` (or absolute-form target) the URL parser refuses (`a b`, a
 * port past 65535), met where a web `Request` must be built for a handler: the client's error.
 */
export const INVALID_HOST: Reply = invalidHostReply()

/** Options of the Express and Fastify `serveTokenApi`. */
export interface ServeTokenApiOptions {
  /**
   * Which proxies may set `X-Forwarded-For` (default `false`: the socket address is the client
   * address), for the allowlist of a Bearer rotation; as `mcpDispatch`'s `trustProxy`.
   */
  trustProxy?: TrustProxy | undefined
}

const SERVE_TOKEN_API_OPTIONS = optionNames<ServeTokenApiOptions>({ trustProxy: true })

/** @internal Checks `serveTokenApi`'s arguments; returns the compiled proxy trust. */
export function setupTokenApi(api: TokenApi, options: ServeTokenApiOptions | undefined): CompiledTrustProxy {
  if (typeof api !== 'function' || typeof (api as { basePath?: unknown }).basePath !== 'string') {
    throw new ConfigurationError('api', 'must be the handler createTokenApi returns')
  }
  if (options != null) {
    if (typeof options !== 'object') throw new ConfigurationError('options', 'must be an object')
    refuseUnknownOptions(options, SERVE_TOKEN_API_OPTIONS, 'serveTokenApi')
  }
  try {
    return compileTrustProxy(options?.trustProxy)
  } catch (error) {
    throw trustProxyError(error)
  }
}

/**
 * `host` (a `Host` value) as the URL parser reads it under `protocol` (`http`, `https`): lower
 * case, without the scheme's default port; `undefined` when it is not an authority and nothing
 * more (`a/b`, `user@host`, `host?x`, `host:99999`, `a b`, punycode the parser refuses, a name
 * with a character no host name has, `a,b` or `a"b`), which would
 * otherwise become part of the App address (the metadata `resource`, the `resource_metadata`
 * URL), or when the parser would rewrite the name itself (`0x7f.1`, `%41`). Every adapter
 * checks the Host with it: the Node ones read it from the request head, and the Web adapter
 * from `request.url`, which @hono/node-server builds without the URL parser for hosts of lower-case
 * letters, digits, dots and hyphens (so `weather.1` or `1.2.3.999` would get through).
 *
 * What Hosts usually are, lower-case names of letters, digits, dots and hyphens with an
 * optional port that is not the default one, is checked in one pass and kept as it is;
 * anything else goes to the URL parser: upper case, a name whose last label starts with a
 * digit (an IPv4 address to the parser: `1.2.3.999` is refused, `0x7f.1` rewritten), a label
 * starting `xn--`, IPv6, other characters.
 */
export function canonicalHost(host: string, protocol: string): string | undefined {
  const n = host.length
  let i = 0
  let plain = n > 0
  for (; i < n; i++) {
    const c = host.charCodeAt(i)
    if (c >= 97 && c <= 122) continue // a to z
    const labelStart = i === 0 || host.charCodeAt(i - 1) === 46
    if (c >= 48 && c <= 57) {
      // A label that starts with a digit, when it turns out to be the last one.
      if (labelStart) plain = plain && !lastLabel(host, i)
      continue
    }
    if (c === 45 /* - */) {
      // `xn--`: punycode, for the parser to check.
      if (i >= 3 && host.charCodeAt(i - 1) === 45 && host.charCodeAt(i - 2) === 110 && host.charCodeAt(i - 3) === 120) {
        if (i === 3 || host.charCodeAt(i - 4) === 46) plain = false
      }
      continue
    }
    if (c === 46 /* . */) continue
    break
  }
  if (plain && i === n) return host
  if (plain && i > 0 && host.charCodeAt(i) === 58 /* : */ && n - i - 1 >= 1 && n - i - 1 <= 5 && host.charCodeAt(i + 1) !== 48) {
    let port = 0
    let j = i + 1
    for (; j < n; j++) {
      const d = host.charCodeAt(j) - 48
      if (d < 0 || d > 9) break
      port = port * 10 + d
    }
    if (j === n && port <= 65535 && port !== (protocol === 'https' ? 443 : 80)) return host
  }
  let url: URL
  try {
    url = new URL(`${protocol}://${host}/`)
  } catch {
    return undefined
  }
  const authority = url.pathname === '/' && url.search === '' && url.hash === '' && url.username === '' && url.password === ''
  // A name the parser rewrites beyond its case (`0x7f.1`, `%41`, a soft hyphen, an empty port)
  // is refused, as @hono/node-server refuses it: the App address is what the client wrote.
  if (!authority || url.hostname === '' || url.hostname !== host.replace(PORT, '').toLowerCase()) return undefined
  // The parser keeps characters no host name has (`,`, `"`, `{`, `;`): a comma joins two Host
  // fields, and none is a name a client meant (RFC 9112 section 3.2: 400).
  if (!HOST_NAME.test(url.hostname)) return undefined
  return url.host
}

const PORT = /:\d+$/

/** A host as the URL parser writes it: a name of RFC 3986 unreserved characters, or an IP literal. */
const HOST_NAME = /^(?:[a-z0-9._~-]+|\[[0-9a-f:.]+\])$/

/** Whether the label starting at `i` is the last of `host` (a trailing dot or a port ends it too). */
function lastLabel(host: string, i: number): boolean {
  for (let j = i; j < host.length; j++) {
    const c = host.charCodeAt(j)
    if (c === 58 /* : */) return true
    if (c === 46 /* . */) return j === host.length - 1 || host.charCodeAt(j + 1) === 58
  }
  return true
}

/** `compileTrustProxy`'s `TypeError` as the option's `ConfigurationError` (its message names the option already). */
function trustProxyError(error: unknown): ConfigurationError {
  return new ConfigurationError('trustProxy', (error as Error).message.replace(/^trustProxy:? /, ''))
}

/**
 * @internal The `ConfigurationError` of a framework mount (Express's `req.baseUrl`, a Fastify
 * context's prefix) that the dispatcher's `basePath`, matched against the full path, names only
 * the inner part of (`''` under `/mcp`, `/mcp` under `/api` + `/mcp`): every request there
 * would be a silent 404. `undefined` for any other pair: a mount the `basePath` lies under, or
 * equals (in any case: Express routes case-insensitively), and one that only differs from it
 * (a parameter's value, `/t/other` beside `basePath` `/t/acme`), whose 404 is the client's.
 * Without a `basePath`, a mount of the dispatcher's own paths (`/v1`, in any case, the
 * metadata's) is served, and no mistake either.
 */
export function mountMissed(basePath: string, mount: string, where: string): ConfigurationError | undefined {
  // A Fastify prefix keeps its trailing slash (`/api/mcp/`), as the basePath does not.
  const m = withoutTrailingSlashes(mount).toLowerCase()
  if (m.length <= basePath.length) return undefined
  const b = basePath.toLowerCase()
  if (!m.endsWith(b) || (b !== '' && m.startsWith(`${b}/`))) return undefined
  // The metadata's RFC 9728 address for the App's (section 3.1), which the dispatcher serves.
  if (b !== '' && m === PROTECTED_RESOURCE_METADATA_PATH + b) return undefined
  if (b === '' && (parseVersionPath(m) !== null || m === '/.well-known' || m === PROTECTED_RESOURCE_METADATA_PATH)) return undefined
  return new ConfigurationError(
    'basePath',
    `is ${JSON.stringify(basePath)}, and the dispatcher matches the full path: under the ${where} ${JSON.stringify(mount)} give the dispatcher basePath: ${JSON.stringify(mount)} (docs/adapters.md)`,
  )
}
