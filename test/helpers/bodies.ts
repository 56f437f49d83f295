/**
 * The JSON-RPC error bodies of spec section 7 and DESIGN.md, exactly as a client reads them:
 * a module of its own, so a test of the library can compare with them without loading the
 * reference platform (test/helpers/platform.ts re-exports them).
 */
export const bodies = {
  unauthorized: (invalidToken: boolean) => ({
    jsonrpc: '2.0',
    id: null,
    error: {
      code: -32001,
      message: 'Unauthorized',
      data: invalidToken
        ? { error: 'unauthorized', description: 'Authentication required: the bearer token is invalid, expired or revoked' }
        : { error: 'unauthorized', description: 'Authentication required: send Authorization: Bearer <token>' },
    },
  }),
  paymentRequired: {
    jsonrpc: '2.0',
    id: null,
    error: {
      code: -32002,
      message: 'Payment Required',
      data: { error: 'payment_required', description: 'An active subscription to this App is required' },
    },
  },
  forbidden: { jsonrpc: '2.0', id: null, error: { code: -32003, message: 'Forbidden' } },
  ipNotAllowed: { jsonrpc: '2.0', id: null, error: { code: -32003, message: 'Forbidden', data: { error: 'ip_not_allowed' } } },
  notFound: { jsonrpc: '2.0', id: null, error: { code: -32004, message: 'Not found', data: { error: 'not_found' } } },
  versionNotFound: (requested: string, latest: string | null) => ({
    jsonrpc: '2.0',
    id: null,
    error: { code: -32004, message: 'Version not found', data: { error: 'version_not_found', requested, latest } },
  }),
  sessionNotFound: {
    jsonrpc: '2.0',
    id: null,
    error: { code: -32004, message: 'Session not found', data: { error: 'session_not_found' } },
  },
  methodNotAllowed: {
    jsonrpc: '2.0',
    id: null,
    error: { code: -32000, message: 'Method not allowed', data: { error: 'method_not_allowed' } },
  },
  rateLimited: (limit: number, resetAt: number, retryAfter: number) => ({
    jsonrpc: '2.0',
    id: null,
    error: { code: -32000, message: 'Rate limit exceeded', data: { limit, resetAt, retryAfter, windowType: 'minute' } },
  }),
}
