/**
 * The few types of `oidc-provider` (which ships none) that the development authorization
 * server uses. Not a complete description of the package.
 */
declare module 'oidc-provider' {
  import type { IncomingMessage, ServerResponse } from 'node:http'

  /** A stored model (token, code, session, interaction…), as the adapter sees it. */
  export interface AdapterPayload {
    [field: string]: unknown
    grantId?: string
    userCode?: string
    uid?: string
    consumed?: number
  }

  /** Persistence for one model (`AccessToken`, `Session`, …). */
  export interface Adapter {
    upsert(id: string, payload: AdapterPayload, expiresIn: number | undefined): Promise<void>
    find(id: string): Promise<AdapterPayload | undefined>
    findByUserCode(userCode: string): Promise<AdapterPayload | undefined>
    findByUid(uid: string): Promise<AdapterPayload | undefined>
    consume(id: string): Promise<void>
    destroy(id: string): Promise<void>
    revokeByGrantId(grantId: string): Promise<void>
  }

  export interface InteractionDetails {
    uid: string
    prompt: { name: string; details: Record<string, unknown> }
    params: Record<string, unknown>
    session?: { accountId?: string }
    grantId?: string
  }

  export interface Grant {
    addOIDCScope(scope: string): void
    addOIDCClaims(claims: string[]): void
    addResourceScope(resource: string, scope: string): void
    save(): Promise<string>
  }

  export interface ClientRef {
    grantTypeAllowed(grantType: string): boolean
    readonly clientAuthMethod: string
    readonly redirectUris: readonly string[]
  }

  export default class Provider {
    constructor(issuer: string, configuration?: Record<string, unknown>)
    readonly issuer: string
    callback(): (req: IncomingMessage, res: ServerResponse) => void
    interactionDetails(req: IncomingMessage, res: ServerResponse): Promise<InteractionDetails>
    interactionFinished(
      req: IncomingMessage,
      res: ServerResponse,
      result: Record<string, unknown>,
      options?: { mergeWithLastSubmission?: boolean },
    ): Promise<void>
    Grant: {
      new (properties: { accountId: string; clientId: string }): Grant
      find(id: string): Promise<Grant | undefined>
    }
    on(event: string, listener: (...args: any[]) => void): this
  }
}
