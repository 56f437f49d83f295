/**
 * mcp-dispatch: the dispatch layer for hosted MCP servers.
 *
 * The root entry holds the framework-agnostic core (pure functions), the pipeline, the
 * token service, OAuth validation and the in-memory stores. Adapters live in
 * `mcp-dispatch/web`, `mcp-dispatch/express` and `mcp-dispatch/fastify`, the streaming proxy
 * handler in `mcp-dispatch/proxy`; stores shared between instances live in their own subpaths,
 * which take the application's client: `mcp-dispatch/redis` (session pins, rate-limit counters,
 * validation cache, invalidations) and `mcp-dispatch/postgres` (API tokens).
 * Nothing here imports a framework or a database client.
 * @module
 */

// Errors
export {
  AuthorizationServerUnavailableError,
  ConfigurationError,
  ConflictError,
  CsrfError,
  DeployRefusedError,
  DispatchError,
  ForbiddenError,
  InvalidInputError,
  JwksUnavailableError,
  NotFoundError,
  StoreUnavailableError,
  TokenInactiveError,
  TooManyValidationsError,
  UnauthorizedError,
  UpstreamError,
  logError,
} from './errors.js'
export type { ConfigurationErrorCode, DispatchErrorCode } from './errors.js'

// Core: pure functions
export {
  API_TOKEN_LENGTH,
  DEFAULT_TOKEN_PREFIX,
  DISPLAY_PREFIX_LENGTH,
  checkApiTokenFormat,
  displayPrefix,
  generateApiToken,
  hashApiToken,
  hashesEqual,
  parseApiToken,
} from './core/api-token.js'
export type { ApiTokenFormatError, ParsedApiToken, RandomBytes } from './core/api-token.js'
export { MAX_BEARER_LENGTH, parseBearerToken } from './core/authorization-header.js'
export type { BearerParseResult } from './core/authorization-header.js'
export { compileTrustProxy, resolveClientAddress } from './core/client-address.js'
export type { CompiledTrustProxy, TrustProxy } from './core/client-address.js'
export { checkIpAllowlist, compileAllowlist, ipInRange, parseCidr, parseIp, validateAllowlist } from './core/ip.js'
export { checkScope } from './core/scope.js'
export type { CidrError, CompiledAllowlist, IpRange, IpWords } from './core/ip.js'
export {
  DEFAULT_SCOPES_SUPPORTED,
  PROTECTED_RESOURCE_METADATA_PATH,
  buildProtectedResourceMetadata,
} from './core/metadata.js'
export type { ProtectedResourceMetadata, ProtectedResourceMetadataOptions } from './core/metadata.js'
export { MAX_RATE_LIMIT, WINDOWS, rateLimitDecision, rateLimitHeaders, windowStart } from './core/rate-limit.js'
export type { RateLimitPolicy, RateLimitResult, WindowType } from './core/rate-limit.js'
export {
  RpcCode,
  authorizationServerUnavailableReply,
  buildWwwAuthenticate,
  contentLengthMismatchReply,
  forbiddenReply,
  invalidHostReply,
  ipNotAllowedReply,
  jsonRpcErrorReply,
  methodNotAllowedReply,
  notFoundReply,
  originNotAllowedReply,
  paymentRequiredReply,
  rateLimitedReply,
  serviceUnavailableReply,
  sessionNotFoundReply,
  unauthorizedReply,
  versionNotFoundReply,
  versionNotServedReply,
} from './core/reply.js'
export type { JsonRpcErrorObject, RateLimitedInfo, Reply, UnauthorizedReplyOptions } from './core/reply.js'
export { MAX_VERSION_LENGTH, applyDeploy, compileVersions, formatSelector, parseVersionPath, resolveVersion } from './core/versions.js'
export type { VersionIndex, VersionSelector } from './core/versions.js'

// Store interfaces and in-memory stores
export type {
  ApiTokenPatch,
  ApiTokenRecord,
  AppRecord,
  AppStore,
  CacheStore,
  InvalidationBus,
  InvalidationMessage,
  MaybePromise,
  RateLimitCount,
  RateLimitStore,
  SessionPin,
  SessionStore,
  SubscriptionStore,
  TokenStore,
} from './core/stores.js'
export {
  createMemoryAppStore,
  createMemoryCacheStore,
  createMemoryInvalidationBus,
  createMemoryRateLimitStore,
  createMemorySessionStore,
  createMemorySubscriptionStore,
  createMemoryTokenStore,
} from './stores/memory/index.js'
export type {
  Clock,
  MemoryAppSeed,
  MemoryAppStore,
  MemorySubscriptionStore,
  MemorySessionStoreOptions,
  MemoryTtlStoreOptions,
} from './stores/memory/index.js'

// Tokens
export { MAX_TOKEN_LIFETIME_MS, TOKEN_LIFETIMES_DAYS, createTokenService, validateTokenName } from './tokens/token-service.js'
export type {
  ApiTokenSecretView,
  ApiTokenStatus,
  ApiTokenView,
  CreateTokenInput,
  RotateCaller,
  SecretCallOptions,
  TokenAuthResult,
  TokenScopeView,
  TokenService,
  TokenServiceOptions,
  UpdateTokenInput,
} from './tokens/token-service.js'

// OAuth access tokens (spec 5.1)
export type {
  AccessTokenContext,
  AccessTokenInfo,
  AccessTokenResult,
  AccessTokenValidator,
} from './auth/access-token-validator.js'
export {
  DEFAULT_OAUTH_CACHE_TTL_MS,
  DEFAULT_OAUTH_REJECTION_TTL_MS,
  DEFAULT_OAUTH_TIMEOUT_MS,
  createOAuthValidator,
} from './auth/oauth-validator.js'
export type {
  CachedValidation,
  OAuthTimers,
  OAuthValidationMode,
  OAuthValidator,
  OAuthValidatorEvent,
  OAuthValidatorOptions,
  UpstreamEndpoint,
} from './auth/oauth-validator.js'
export { DEFAULT_COOL_DOWN_MS, DEFAULT_FAILURE_THRESHOLD, createCircuitBreaker } from './auth/circuit-breaker.js'
export type {
  BreakerPermit,
  BreakerState,
  BreakerStateChange,
  CircuitBreaker,
  CircuitBreakerOptions,
} from './auth/circuit-breaker.js'
export type { RetryOptions } from './auth/backoff.js'
export type { ClientBudgetOptions } from './auth/client-budget.js'

// Pipeline
export { createDispatcher } from './pipeline/dispatcher.js'
export type {
  Decision,
  DispatchContext,
  DispatchOutcome,
  DispatchRequest,
  Dispatcher,
  DispatcherOptions,
  DispatcherTimers,
  Identity,
} from './pipeline/dispatcher.js'

// Token-management HTTP API (web-standard)
export { createTokenApi } from './tokens/token-api.js'
export type { TokenApi, TokenApiOptions, TokenApiRequestInfo, TokenApiSession } from './tokens/token-api.js'
