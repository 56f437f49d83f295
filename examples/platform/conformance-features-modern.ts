/**
 * The conformance suite's features for MCP 2026-07-28 clients (SDK v2, `createMcpHandler`):
 * the same tools, resources, prompts and completions as the 2025 server of
 * conformance-features.ts, from the same definitions; a tool whose argument travels in an
 * `Mcp-Param-*` header; and the multi-round-trip tools and prompt (SEP-2322: a result that asks
 * the client for input, answered by a retry), whose `requestState` is HMAC-sealed. What
 * 2026-07-28 replaced (server-to-client requests, sessions, `resources/subscribe`,
 * `logging/setLevel`) stays on the 2025 server.
 */
import { randomBytes } from 'node:crypto'
import { setTimeout as delay } from 'node:timers/promises'
import {
  type McpServer,
  type RequestStateCodec,
  type ServerContext,
  type ServerNotifier,
  ResourceTemplate,
  acceptedContent,
  completable,
  createRequestStateCodec,
  inputRequired,
} from '@modelcontextprotocol/server'
import { z } from 'zod'
import {
  CONTENT_TOOLS,
  ERROR_TOOL,
  JSON_SCHEMA_2020_12_INPUT,
  PROMPTS,
  STATIC_RESOURCES,
  STEP_MS,
  SCHEMA_TOOL,
  TEMPLATE_RESOURCE,
  completeArg1,
  text,
} from './conformance-features.js'

/** The tools this module adds for 2026-07-28 clients (the App's own are `get_version`, `echo`, `count`). */
export const MODERN_CONFORMANCE_TOOLS = [
  'json_schema_2020_12_tool',
  'test_audio_content',
  'test_custom_headers',
  'test_embedded_resource',
  'test_error_handling',
  'test_image_content',
  'test_input_required_result_capabilities',
  'test_input_required_result_elicitation',
  'test_input_required_result_list_roots',
  'test_input_required_result_multi_round',
  'test_input_required_result_multiple_inputs',
  'test_input_required_result_request_state',
  'test_input_required_result_sampling',
  'test_input_required_result_tampered_state',
  'test_logging_tool',
  'test_missing_capability',
  'test_multiple_content_types',
  'test_simple_text',
  'test_streaming_elicitation',
  'test_tool_with_progress',
  'test_trigger_prompt_change',
  'test_trigger_tool_change',
] as const

/**
 * Seals the multi-round-trip state: a retry with altered state is refused (-32602) before the
 * tool runs. One key per process, so one process must serve every round of a call (as here).
 */
export const requestStateCodec: RequestStateCodec = createRequestStateCodec({
  key: randomBytes(32),
  // Bound to the caller, App and version the dispatch layer served the round to (the
  // platform passes them as `authInfo`), and to the method: state minted for one cannot be
  // replayed by another user, at another App or version. Signed, not encrypted: the client
  // can read the payload, so it holds nothing secret.
  bind: (ctx) => {
    const who = (ctx.http?.authInfo?.extra ?? {}) as { subject?: unknown; appId?: unknown; version?: unknown }
    return [ctx.mcpReq.method, who.subject, who.appId, who.version].map((part) => String(part ?? '')).join('\u0000')
  },
})

/** Registers the request-scoped conformance features on a v2 server, before it serves. */
export function registerModernConformanceFeatures(server: McpServer, notify: ServerNotifier): void {
  registerMultiRoundTrip(server)
  // The suite's hooks for list changes (SEP-2575): the lists themselves are fixed, so each
  // announces a change as one would, on the version's open `subscriptions/listen` streams.
  server.registerTool(
    'test_trigger_tool_change',
    { description: 'Announces a tool list change on the open subscriptions/listen streams of this App version.' },
    async () => {
      notify.toolsChanged()
      return text('notifications/tools/list_changed sent to the open subscriptions that asked for it.')
    },
  )
  server.registerTool(
    'test_trigger_prompt_change',
    { description: 'Announces a prompt list change on the open subscriptions/listen streams of this App version.' },
    async () => {
      notify.promptsChanged()
      return text('notifications/prompts/list_changed sent to the open subscriptions that asked for it.')
    },
  )
  server.registerTool(
    'test_custom_headers',
    {
      description: 'Echoes its region, which the client also sends as the Mcp-Param-Region header (SEP-2243).',
      inputSchema: z.object({ region: z.string().max(200).meta({ 'x-mcp-header': 'Region' }) }),
    },
    async ({ region }) => text(`region=${region}`),
  )
  for (const tool of CONTENT_TOOLS) server.registerTool(tool.name, { description: tool.description }, async () => tool.result())
  server.registerTool(ERROR_TOOL.name, { description: ERROR_TOOL.description }, async () => {
    throw new Error(ERROR_TOOL.message)
  })
  server.registerTool(
    'test_tool_with_progress',
    { description: 'Reports progress 0, 50 and 100 of 100, 50 ms apart, when given a progress token.' },
    async (ctx) => {
      const token = ctx.mcpReq._meta?.progressToken
      for (const progress of [0, 50, 100]) {
        if (progress > 0) await delay(STEP_MS)
        if (token !== undefined) await ctx.mcpReq.notify({ method: 'notifications/progress', params: { progressToken: token, progress, total: 100 } })
      }
      return text('Progress reported: 0, 50, 100 of 100.')
    },
  )
  server.registerTool(SCHEMA_TOOL.name, { description: SCHEMA_TOOL.description, inputSchema: JSON_SCHEMA_2020_12_INPUT }, async (args) =>
    SCHEMA_TOOL.run(args),
  )
  for (const resource of STATIC_RESOURCES) {
    server.registerResource(resource.name, resource.uri, resource.metadata, async (uri) => ({ contents: resource.contents(uri.href) }))
  }
  server.registerResource(
    TEMPLATE_RESOURCE.name,
    new ResourceTemplate(TEMPLATE_RESOURCE.uriTemplate, {
      list: undefined,
      complete: { id: TEMPLATE_RESOURCE.completeId },
    }),
    TEMPLATE_RESOURCE.metadata,
    async (uri, { id }) => ({ contents: TEMPLATE_RESOURCE.contents(uri.href, id) }),
  )
  server.registerPrompt(PROMPTS.simple.name, { description: PROMPTS.simple.description }, () => PROMPTS.simple.messages())
  server.registerPrompt(
    PROMPTS.withArguments.name,
    {
      description: PROMPTS.withArguments.description,
      argsSchema: z.object({
        arg1: completable(z.string().max(10_000).describe('First test argument'), completeArg1),
        arg2: z.string().max(10_000).describe('Second test argument'),
      }),
    },
    (args) => PROMPTS.withArguments.messages(args),
  )
  server.registerPrompt(
    PROMPTS.embeddedResource.name,
    {
      description: PROMPTS.embeddedResource.description,
      argsSchema: z.object({ resourceUri: z.string().max(2_048).describe('URI of the resource to embed') }),
    },
    (args) => PROMPTS.embeddedResource.messages(args),
  )
  server.registerPrompt(PROMPTS.image.name, { description: PROMPTS.image.description }, () => PROMPTS.image.messages())
}

const NAME_SCHEMA = { type: 'object' as const, properties: { name: { type: 'string' as const } }, required: ['name'] }
const askName = (message: string) => inputRequired.elicit({ message, requestedSchema: NAME_SCHEMA })
const ask = (message: string, key: string, type: 'string' | 'boolean') =>
  inputRequired.elicit({
    message,
    requestedSchema: { type: 'object', properties: { [key]: type === 'string' ? { type } : { type } }, required: [key] },
  })

/** A sampling answer's text, or `undefined` when `value` is not one (answers come from the client). */
function sampledText(value: unknown): string | undefined {
  const content = (value as { content?: unknown } | null | undefined)?.content
  const blocks = Array.isArray(content) ? content : [content]
  const texts = blocks.filter(
    (b): b is { type: 'text'; text: string } => (b as { type?: unknown } | null)?.type === 'text' && typeof (b as { text?: unknown }).text === 'string',
  )
  return texts.length > 0 ? texts.map((b) => b.text).join('').slice(0, MAX_ANSWER) : undefined
}

/** A `roots/list` answer's URIs, or `undefined` when `value` is not one (answers come from the client). */
function rootUris(value: unknown): string[] | undefined {
  const roots = (value as { roots?: unknown } | null | undefined)?.roots
  if (!Array.isArray(roots) || roots.length > 100) return undefined
  const uris = roots.map((r) => (r as { uri?: unknown } | null)?.uri)
  return uris.every((u): u is string => typeof u === 'string' && u.length <= MAX_ANSWER) ? uris : undefined
}

/** Longest text taken from an answer the client gives (it may go back into sealed state). */
const MAX_ANSWER = 1_000
/** An elicited text field of an accepted answer, when it is a string of sensible length. */
function field(value: unknown): string | undefined {
  return typeof value === 'string' && value.length <= MAX_ANSWER ? value : undefined
}

/** Sealed state naming the step a call is at (and what it learnt so far). */
interface Step {
  step: string
  name?: string
}
/** The client capabilities a 2026-07-28 request declares in its `_meta`. */
function declaredCapabilities(ctx: ServerContext): { elicitation?: object; sampling?: object } {
  const envelope = ctx.mcpReq.envelope as { 'io.modelcontextprotocol/clientCapabilities'?: { elicitation?: object; sampling?: object } } | undefined
  return envelope?.['io.modelcontextprotocol/clientCapabilities'] ?? {}
}
const stateOf = (ctx: ServerContext) => ctx.mcpReq.requestState<Step>()
const seal = (step: Step, ctx: ServerContext) => requestStateCodec.mint(step, ctx)

/** The multi-round-trip tools and prompt of SEP-2322, by the scenarios' names and payloads. */
function registerMultiRoundTrip(server: McpServer): void {
  const tool = (name: string, description: string, run: (ctx: ServerContext) => ReturnType<Parameters<McpServer['registerTool']>[2]>) =>
    server.registerTool(name, { description }, run as never)
  const responses = (ctx: ServerContext) => ctx.mcpReq.inputResponses ?? {}

  tool('test_input_required_result_elicitation', 'Asks for a name (elicitation), then greets.', async (ctx) => {
    const name = field(acceptedContent<{ name?: unknown }>(ctx.mcpReq.inputResponses, 'user_name')?.name)
    if (name === undefined) return inputRequired({ inputRequests: { user_name: askName('What is your name?') } })
    return text(`Hello, ${name}!`)
  })
  tool('test_input_required_result_sampling', 'Asks the client to sample an LLM, then returns its answer.', async (ctx) => {
    const answer = sampledText(responses(ctx).capital_question)
    if (answer === undefined) {
      return inputRequired({
        inputRequests: {
          capital_question: inputRequired.createMessage({
            messages: [{ role: 'user', content: { type: 'text', text: 'What is the capital of France?' } }],
            maxTokens: 100,
          }),
        },
      })
    }
    return text(`LLM response: ${answer}`)
  })
  tool('test_input_required_result_list_roots', 'Asks for the client roots, then lists them.', async (ctx) => {
    const uris = rootUris(responses(ctx).client_roots)
    if (uris === undefined) return inputRequired({ inputRequests: { client_roots: inputRequired.listRoots() } })
    return text(`Client roots: ${uris.join(', ') || '(none)'}`)
  })
  tool('test_input_required_result_request_state', 'Asks for a confirmation with sealed state, then checks the state.', async (ctx) => {
    const confirmed = acceptedContent<{ ok?: unknown }>(ctx.mcpReq.inputResponses, 'confirm')
    if (stateOf(ctx)?.step === 'confirm' && typeof confirmed?.ok === 'boolean') return text(`state-ok: confirmed=${confirmed.ok}`)
    return inputRequired({ inputRequests: { confirm: ask('Please confirm', 'ok', 'boolean') }, requestState: await seal({ step: 'confirm' }, ctx) })
  })
  tool('test_input_required_result_multiple_inputs', 'Asks for a name, a sampled greeting and the roots at once.', async (ctx) => {
    const got = responses(ctx)
    const name = field(acceptedContent<{ name?: unknown }>(ctx.mcpReq.inputResponses, 'user_name')?.name)
    const greeting = sampledText(got.greeting)
    const roots = rootUris(got.client_roots)
    if (stateOf(ctx)?.step === 'all' && name !== undefined && greeting !== undefined && roots !== undefined) {
      return text(`${greeting} ${name} (roots: ${roots.join(', ') || 'none'})`)
    }
    return inputRequired({
      inputRequests: {
        user_name: askName('What is your name?'),
        greeting: inputRequired.createMessage({
          messages: [{ role: 'user', content: { type: 'text', text: 'Generate a greeting' } }],
          maxTokens: 50,
        }),
        client_roots: inputRequired.listRoots(),
      },
      requestState: await seal({ step: 'all' }, ctx),
    })
  })
  tool('test_input_required_result_multi_round', 'Asks for a name, then a colour, carrying state between rounds.', async (ctx) => {
    const state = stateOf(ctx)
    const name = field(acceptedContent<{ name?: unknown }>(ctx.mcpReq.inputResponses, 'step1')?.name)
    const color = field(acceptedContent<{ color?: unknown }>(ctx.mcpReq.inputResponses, 'step2')?.color)
    if (state?.step === 'step2' && color !== undefined) return text(`${state.name} likes ${color}.`)
    if (state?.step === 'step1' && name !== undefined) {
      return inputRequired({
        inputRequests: { step2: ask('Step 2: What is your favorite color?', 'color', 'string') },
        requestState: await seal({ step: 'step2', name }, ctx),
      })
    }
    return inputRequired({ inputRequests: { step1: askName('Step 1: What is your name?') }, requestState: await seal({ step: 'step1' }, ctx) })
  })
  tool('test_input_required_result_tampered_state', 'Sealed state: a retry whose state was altered is refused (-32602).', async (ctx) => {
    const confirmed = acceptedContent<{ ok?: unknown }>(ctx.mcpReq.inputResponses, 'confirm')
    if (stateOf(ctx)?.step === 'sealed' && confirmed !== undefined) return text('state verified')
    return inputRequired({ inputRequests: { confirm: ask('Please confirm', 'ok', 'boolean') }, requestState: await seal({ step: 'sealed' }, ctx) })
  })
  // The diagnostic tools of SEP-2575 (stateless serving).
  // It asks for sampling whatever the client declared: the SDK refuses to send an input request
  // the request's capabilities do not allow (-32021 MissingRequiredClientCapabilityError, 400).
  tool('test_missing_capability', 'Needs the sampling capability: without it in the request, -32021 (HTTP 400).', async (ctx) => {
    const answer = sampledText(responses(ctx).sample)
    if (answer !== undefined) return text(`LLM response: ${answer}`)
    return inputRequired({
      inputRequests: {
        sample: inputRequired.createMessage({ messages: [{ role: 'user', content: { type: 'text', text: 'Say hello' } }], maxTokens: 20 }),
      },
    })
  })
  tool('test_streaming_elicitation', 'Reports progress, then asks for a name: the stream holds notifications and the result only.', async (ctx) => {
    const token = ctx.mcpReq._meta?.progressToken
    if (token !== undefined) await ctx.mcpReq.notify({ method: 'notifications/progress', params: { progressToken: token, progress: 1, total: 2 } })
    const name = field(acceptedContent<{ name?: unknown }>(ctx.mcpReq.inputResponses, 'user_name')?.name)
    if (name === undefined) return inputRequired({ inputRequests: { user_name: askName('What is your name?') } })
    return text(`Hello, ${name}!`)
  })
  tool('test_logging_tool', 'Logs two messages, which reach the client only when its request set a log level.', async (ctx) => {
    await ctx.mcpReq.log('info', 'Tool execution started', 'conformance')
    await ctx.mcpReq.log('info', 'Tool execution completed', 'conformance')
    return text('Logged two messages.')
  })
  tool('test_input_required_result_capabilities', 'Asks only for the input the client said it can give.', async (ctx) => {
    const declared = declaredCapabilities(ctx)
    const got = responses(ctx)
    const requests: Record<string, ReturnType<typeof askName>> = {}
    // A form elicitation needs `elicitation: {}` (form, by default) or `elicitation.form`.
    const elicitation = declared.elicitation as Record<string, unknown> | undefined
    const canForm = elicitation !== undefined && (Object.keys(elicitation).length === 0 || 'form' in elicitation)
    if (canForm && got.user_name === undefined) requests.user_name = askName('What is your name?')
    if (declared.sampling && got.greeting === undefined) {
      requests.greeting = inputRequired.createMessage({ messages: [{ role: 'user', content: { type: 'text', text: 'Generate a greeting' } }], maxTokens: 50 })
    }
    if (Object.keys(requests).length > 0) return inputRequired({ inputRequests: requests })
    return text(`Answered: ${Object.keys(got).sort().join(', ') || 'nothing (the client can give no input)'}`)
  })
  server.registerPrompt(
    'test_input_required_result_prompt',
    { description: 'A prompt that first asks the user for its context (elicitation).' },
    async (ctx) => {
      const context = field(acceptedContent<{ context?: unknown }>(ctx.mcpReq.inputResponses, 'user_context')?.context)
      if (context === undefined) {
        return inputRequired({ inputRequests: { user_context: ask('What context should the prompt use?', 'context', 'string') } })
      }
      return { messages: [{ role: 'user', content: { type: 'text', text: `Use this context: ${context}` } }] }
    },
  )
}
