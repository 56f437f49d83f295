/**
 * Pieces every adapter shares: building the dispatcher from options, the neutral request,
 * and the replies for handler failures. Adapters translate; no rule lives here.
 * @internal
 * @module
 */
import { type CompiledTrustProxy, type TrustProxy, compileTrustProxy } from '../core/client-address.js'
import type { TokenApi } from '../tokens/token-api.js'
import { type Reply, invalidHostReply, jsonRpcErrorReply } from '../core/reply.js'
import { ConfigurationError, logError } from '../errors.js'
import { type Dispatcher, type DispatcherOptions, createDispatcher } from '../pipeline/dispatcher.js'

/** Options every adapter accepts. */
export interface AdapterOptions {
  /** A dispatcher, or the options to create one. */
  dispatcher: Dispatcher | DispatcherOptions
  /**
   * Which proxies may set `X-Forwarded-For` (default `false`: the header is ignored and the
   * socket address is the client address).
   */
  trustProxy?: TrustProxy
  /** Called with handler failures and other errors the client only sees as a status. Default `logError` (stderr). */
  onError?: (error: unknown, context: string) => void
}

/** @internal */
export function setupAdapter(options: AdapterOptions): {
  dispatcher: Dispatcher
  trust: CompiledTrustProxy
  onError: (error: unknown, context: string) => void
} {
  if (!options || !options.dispatcher) throw new ConfigurationError('dispatcher', 'is required')
  const onError = options.onError ?? logError
  // Built here from options: the dispatcher's own failures (stores, session pins) go to the
  // adapter's `onError` too, unless the options name a reporter of their own.
  const dispatcher =
    'decide' in options.dispatcher
      ? options.dispatcher
      : createDispatcher({ ...(options.onError && { onError: options.onError }), ...(options.dispatcher as DispatcherOptions) })
  let trust: CompiledTrustProxy
  try {
    trust = compileTrustProxy(options.trustProxy)
  } catch (error) {
    throw new ConfigurationError('trustProxy', (error as Error).message)
  }
  return { dispatcher, trust, onError }
}

/**
 * Answer when the App's handler throws or fails before sending a response: the dispatch
 * layer is a gateway in front of the App, so 502, with no detail of the failure.
 */
export const HANDLER_FAILED: Reply = jsonRpcErrorReply(502, {
  code: -32603,
  message: 'App handler failed',
  data: { error: 'handler_error' },
})

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
  trustProxy?: TrustProxy
}

/** @internal Checks `serveTokenApi`'s arguments; returns the compiled proxy trust. */
export function setupTokenApi(api: TokenApi, options: ServeTokenApiOptions | undefined): CompiledTrustProxy {
  if (typeof api !== 'function' || typeof (api as { basePath?: unknown }).basePath !== 'string') {
    throw new ConfigurationError('api', 'must be the handler createTokenApi returns')
  }
  try {
    return compileTrustProxy(options?.trustProxy)
  } catch (error) {
    throw new ConfigurationError('trustProxy', (error as Error).message)
  }
}
