/**
 * The MCP features the official conformance suite (`@modelcontextprotocol/conformance`, its
 * server scenarios) exercises, served by every App version of the platform beside the App's own
 * tools: content of every type, logging, progress, sampling, elicitation (SEP-1034 defaults,
 * SEP-1330 enums), a JSON Schema 2020-12 input schema (SEP-1613), a tool that closes its SSE
 * stream mid-call (SEP-1699), resources (static, binary, templated, subscribable), prompts and
 * completion. Names and payloads are the ones the scenarios ask for (docs/platform.md lists them).
 *
 * Each MCP server gets its own state (log level, subscriptions, the watched resource's text),
 * so in a stateful session it lives as long as the session.
 */
import { setTimeout as delay } from 'node:timers/promises'
import { completable } from '@modelcontextprotocol/sdk/server/completable.js'
import { type McpServer, ResourceTemplate } from '@modelcontextprotocol/sdk/server/mcp.js'
import type { RequestHandlerExtra } from '@modelcontextprotocol/sdk/shared/protocol.js'
import {
  type CallToolResult,
  type ElicitRequestFormParams,
  type LoggingLevel,
  type ServerNotification,
  type ServerRequest,
  ErrorCode,
  LoggingLevelSchema,
  McpError,
  SetLevelRequestSchema,
  SubscribeRequestSchema,
  UnsubscribeRequestSchema,
} from '@modelcontextprotocol/sdk/types.js'
import { z } from 'zod'

type Extra = RequestHandlerExtra<ServerRequest, ServerNotification>
/** Sends a log message to the client of the request being served (see {@link registerLogLevel}). */
type Log = (extra: Extra, level: LoggingLevel, data: string) => Promise<void>

/** A 1×1 red PNG (RGB, 8 bits). */
export const RED_PIXEL_PNG = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR42mP4z8AAAAMBAQD3A0FDAAAAAElFTkSuQmCC'
/** One millisecond of silence: a WAV of 8 unsigned 8-bit mono samples at 8 kHz. */
export const SILENT_WAV = 'UklGRiwAAABXQVZFZm10IBAAAAABAAEAQB8AAEAfAAABAAgAZGF0YQgAAACAgICAgICAgA=='

/** The tools this module adds to an App (the App's own are `get_version`, `echo`, `count`). */
export const CONFORMANCE_TOOLS = [
  'json_schema_2020_12_tool',
  'test_audio_content',
  'test_elicitation',
  'test_elicitation_sep1034_defaults',
  'test_elicitation_sep1330_enums',
  'test_embedded_resource',
  'test_error_handling',
  'test_image_content',
  'test_multiple_content_types',
  'test_reconnection',
  'test_sampling',
  'test_simple_text',
  'test_tool_with_logging',
  'test_tool_with_progress',
  'update_watched_resource',
] as const

const WATCHED_URI = 'test://watched-resource'
/** Pause between the steps of the logging and progress tools, so the messages arrive apart. */
export const STEP_MS = 50
const JSON_SCHEMA_2020_12 = 'https://json-schema.org/draft/2020-12/schema'
/** Words offered by completion (`completion/complete`) for the first argument of the prompt. */
export const ARG1_SUGGESTIONS = ['hello', 'help', 'test', 'testing', 'world']
/** Ids offered by completion for `{id}` of the template resource. */
const TEMPLATE_IDS = ['1', '42', '123']

export function text(value: string): CallToolResult {
  return { content: [{ type: 'text', text: value }] }
}

/** The tools whose result is fixed content of each type: the same under both MCP revisions. */
export const CONTENT_TOOLS: ReadonlyArray<{ name: string; description: string; result: () => CallToolResult }> = [
  { name: 'test_simple_text', description: 'Returns one text block.', result: () => text('This is a simple text response for testing.') },
  {
    name: 'test_image_content',
    description: 'Returns a PNG image (one red pixel).',
    result: () => ({ content: [{ type: 'image', data: RED_PIXEL_PNG, mimeType: 'image/png' }] }),
  },
  {
    name: 'test_audio_content',
    description: 'Returns a WAV clip (1 ms of silence).',
    result: () => ({ content: [{ type: 'audio', data: SILENT_WAV, mimeType: 'audio/wav' }] }),
  },
  {
    name: 'test_embedded_resource',
    description: 'Returns an embedded text resource.',
    result: () => ({
      content: [
        {
          type: 'resource',
          resource: { uri: 'test://embedded-resource', mimeType: 'text/plain', text: 'This is an embedded resource content.' },
        },
      ],
    }),
  },
  {
    name: 'test_multiple_content_types',
    description: 'Returns text, an image and an embedded JSON resource.',
    result: () => ({
      content: [
        { type: 'text', text: 'Multiple content types test:' },
        { type: 'image', data: RED_PIXEL_PNG, mimeType: 'image/png' },
        {
          type: 'resource',
          resource: {
            uri: 'test://mixed-content-resource',
            mimeType: 'application/json',
            text: JSON.stringify({ test: 'data', value: 123 }),
          },
        },
      ],
    }),
  },
]
export const ERROR_TOOL = {
  name: 'test_error_handling',
  description: 'Always fails: the result is a tool error (isError).',
  message: 'This tool intentionally returns an error for testing',
}

/** The fixed resources (name, URI, metadata, contents), and the template's contents. */
export const STATIC_RESOURCES = [
  {
    name: 'static-text',
    uri: 'test://static-text',
    metadata: { description: 'A fixed text resource.', mimeType: 'text/plain' },
    contents: (href: string) => [{ uri: href, mimeType: 'text/plain', text: 'This is the content of the static text resource.' }],
  },
  {
    name: 'static-binary',
    uri: 'test://static-binary',
    metadata: { description: 'A fixed binary resource (a PNG of one red pixel).', mimeType: 'image/png' },
    contents: (href: string) => [{ uri: href, mimeType: 'image/png', blob: RED_PIXEL_PNG }],
  },
] as const
export const TEMPLATE_RESOURCE = {
  name: 'template-data',
  uriTemplate: 'test://template/{id}/data',
  metadata: { description: 'JSON data for the id in the URI.', mimeType: 'application/json' },
  /** Completions of `{id}`. */
  completeId: (value: string) => TEMPLATE_IDS.filter((id) => id.startsWith(value)),
  contents: (href: string, id: unknown) => [
    { uri: href, mimeType: 'application/json', text: JSON.stringify({ id, templateTest: true, data: `Data for ID: ${id}` }) },
  ],
}

/** The prompts' messages, whatever the SDK line that serves them. */
export const PROMPTS = {
  simple: {
    name: 'test_simple_prompt',
    description: 'A prompt without arguments.',
    messages: () => ({ messages: [{ role: 'user' as const, content: { type: 'text' as const, text: 'This is a simple prompt for testing.' } }] }),
  },
  withArguments: {
    name: 'test_prompt_with_arguments',
    description: 'A prompt with two arguments; the first one completes (completion/complete).',
    messages: ({ arg1, arg2 }: { arg1: string; arg2: string }) => ({
      messages: [{ role: 'user' as const, content: { type: 'text' as const, text: `Prompt with arguments: arg1='${arg1}', arg2='${arg2}'` } }],
    }),
  },
  embeddedResource: {
    name: 'test_prompt_with_embedded_resource',
    description: 'A prompt that embeds the resource it is given.',
    messages: ({ resourceUri }: { resourceUri: string }) => ({
      messages: [
        {
          role: 'user' as const,
          content: {
            type: 'resource' as const,
            resource: { uri: resourceUri, mimeType: 'text/plain', text: 'Embedded resource content for testing.' },
          },
        },
        { role: 'user' as const, content: { type: 'text' as const, text: 'Please process the embedded resource above.' } },
      ],
    }),
  },
  image: {
    name: 'test_prompt_with_image',
    description: 'A prompt with an image (one red pixel).',
    messages: () => ({
      messages: [
        { role: 'user' as const, content: { type: 'image' as const, data: RED_PIXEL_PNG, mimeType: 'image/png' } },
        { role: 'user' as const, content: { type: 'text' as const, text: 'Please analyze the image above.' } },
      ],
    }),
  },
}
/** Completions of the first argument of `test_prompt_with_arguments`. */
export const completeArg1 = (value: string) => ARG1_SUGGESTIONS.filter((word) => word.startsWith(value.toLowerCase()))

/**
 * Registers every conformance tool, resource and prompt on `server`, before it connects.
 *
 * @example
 * ```ts
 * const server = new McpServer({ name: 'weather', version: '1.0.0' }, { capabilities: { logging: {} } })
 * registerConformanceFeatures(server)
 * ```
 */
export function registerConformanceFeatures(server: McpServer): void {
  const log = registerLogLevel(server)
  registerContentTools(server)
  registerProgressTools(server, log)
  registerClientRequestTools(server)
  registerSchemaTool(server)
  registerResources(server)
  registerPrompts(server)
}

/**
 * Keeps the level set by `logging/setLevel` (every level until then) and returns a logger that
 * sends `notifications/message` on the stream of the request being served, so the client reads
 * the messages before the result.
 */
function registerLogLevel(server: McpServer): Log {
  const severity = (level: LoggingLevel) => LoggingLevelSchema.options.indexOf(level)
  let minimum: LoggingLevel = 'debug'
  server.server.setRequestHandler(SetLevelRequestSchema, (request) => {
    minimum = request.params.level
    return {}
  })
  return async (extra, level, data) => {
    if (severity(level) < severity(minimum)) return
    await extra.sendNotification({ method: 'notifications/message', params: { level, logger: 'conformance', data } })
  }
}

/** Tools whose result is fixed content of each type, and one that fails. */
function registerContentTools(server: McpServer): void {
  for (const tool of CONTENT_TOOLS) server.registerTool(tool.name, { description: tool.description, inputSchema: {} }, async () => tool.result())
  server.registerTool(ERROR_TOOL.name, { description: ERROR_TOOL.description, inputSchema: {} }, async () => {
    throw new Error(ERROR_TOOL.message)
  })
}

/** Tools that send notifications while they run, and one that hands its stream back early. */
function registerProgressTools(server: McpServer, log: Log): void {
  server.registerTool(
    'test_tool_with_logging',
    { description: 'Sends three info log messages, 50 ms apart, while it runs.', inputSchema: {} },
    async (_args, extra) => {
      await log(extra, 'info', 'Tool execution started')
      await delay(STEP_MS)
      await log(extra, 'info', 'Tool processing data')
      await delay(STEP_MS)
      await log(extra, 'info', 'Tool execution completed')
      return text('Logged three messages while running.')
    },
  )
  server.registerTool(
    'test_tool_with_progress',
    { description: 'Reports progress 0, 50 and 100 of 100, 50 ms apart, when given a progress token.', inputSchema: {} },
    async (_args, extra) => {
      const token = extra._meta?.progressToken
      for (const progress of [0, 50, 100]) {
        if (progress > 0) await delay(STEP_MS)
        if (token !== undefined) {
          await extra.sendNotification({ method: 'notifications/progress', params: { progressToken: token, progress, total: 100 } })
        }
      }
      return text('Progress reported: 0, 50, 100 of 100.')
    },
  )
  server.registerTool(
    'test_reconnection',
    {
      description:
        'Closes its SSE stream before answering (SEP-1699): a client that resumes with Last-Event-ID gets the result replayed.',
      inputSchema: {},
    },
    async (_args, extra) => {
      // Only offered to clients of protocol 2025-11-25 or later on a resumable session; others
      // keep the stream and get the result on it.
      extra.closeSSEStream?.()
      await delay(STEP_MS)
      return text('Reconnection test completed.')
    },
  )
}

/** Tools that ask the client something (sampling, elicitation) on the stream of the call. */
function registerClientRequestTools(server: McpServer): void {
  server.registerTool(
    'test_sampling',
    { description: 'Asks the client to sample an LLM with the prompt and returns its answer.', inputSchema: { prompt: z.string().max(10_000) } },
    async ({ prompt }, extra) => {
      if (!server.server.getClientCapabilities()?.sampling) throw new Error('The client does not support sampling')
      const result = await server.server.createMessage(
        { messages: [{ role: 'user', content: { type: 'text', text: prompt } }], maxTokens: 100 },
        { relatedRequestId: extra.requestId },
      )
      const blocks = Array.isArray(result.content) ? result.content : [result.content]
      const answer = blocks.map((b) => (b.type === 'text' ? b.text : `[${b.type}]`)).join('')
      return text(`LLM response: ${answer}`)
    },
  )
  const elicit = async (params: ElicitRequestFormParams, extra: Extra) => {
    if (!server.server.getClientCapabilities()?.elicitation) throw new Error('The client does not support elicitation')
    return server.server.elicitInput(params, { relatedRequestId: extra.requestId })
  }
  const outcome = (r: { action: string; content?: unknown }) => `action=${r.action}, content=${JSON.stringify(r.content ?? {})}`
  server.registerTool(
    'test_elicitation',
    { description: 'Asks the user (elicitation) for a user name and an email address.', inputSchema: { message: z.string().max(10_000) } },
    async ({ message }, extra) => {
      const result = await elicit(
        {
          message,
          requestedSchema: {
            type: 'object',
            properties: {
              username: { type: 'string', description: "User's response" },
              email: { type: 'string', description: "User's email address" },
            },
            required: ['username', 'email'],
          },
        },
        extra,
      )
      return text(`User response: ${outcome(result)}`)
    },
  )
  /** A tool without arguments that elicits `properties` with `message` and reports the answer. */
  const elicitingTool = (
    name: string,
    description: string,
    message: string,
    properties: ElicitRequestFormParams['requestedSchema']['properties'],
  ) =>
    server.registerTool(name, { description, inputSchema: {} }, async (_args, extra) => {
      const result = await elicit({ message, requestedSchema: { type: 'object', properties } }, extra)
      return text(`Elicitation completed: ${outcome(result)}`)
    })
  elicitingTool(
    'test_elicitation_sep1034_defaults',
    'Elicits one field of each primitive type, each with a default value (SEP-1034).',
    'Please review your profile (defaults are filled in).',
    {
      name: { type: 'string', description: 'Name', default: 'John Doe' },
      age: { type: 'integer', description: 'Age', default: 30 },
      score: { type: 'number', description: 'Score', default: 95.5 },
      status: { type: 'string', description: 'Status', enum: ['active', 'inactive', 'pending'], default: 'active' },
      verified: { type: 'boolean', description: 'Verified', default: true },
    },
  )
  const titled = (prefix: string, label: string) =>
    ['First', 'Second', 'Third'].map((ordinal, i) => ({ const: `${prefix}${i + 1}`, title: `${ordinal} ${label}` }))
  elicitingTool(
    'test_elicitation_sep1330_enums',
    'Elicits one field of each enum form: single or multiple choice, with or without titles (SEP-1330).',
    'Please pick your options.',
    {
      untitledSingle: { type: 'string', enum: ['option1', 'option2', 'option3'] },
      titledSingle: { type: 'string', oneOf: titled('value', 'Option') },
      legacyEnum: { type: 'string', enum: ['opt1', 'opt2', 'opt3'], enumNames: ['Option One', 'Option Two', 'Option Three'] },
      untitledMulti: { type: 'array', items: { type: 'string', enum: ['option1', 'option2', 'option3'] } },
      titledMulti: { type: 'array', items: { anyOf: titled('value', 'Choice') } },
    },
  )
}

/**
 * The input of a tool that keeps the JSON Schema 2020-12 keywords `$schema`, `$defs` and
 * `additionalProperties` (SEP-1613), and those SEP-2106 adds (`$anchor` in `$defs`,
 * `allOf`/`anyOf`, `if`/`then`/`else`). The SDK renders zod as draft-07, inlining or moving shared
 * definitions to `definitions`, so the 2020-12 parts are given as metadata, which zod copies
 * verbatim; the address is still validated by zod on the way in. Built once: zod schemas are
 * immutable, and building this one costs more than the rest of an MCP server's features.
 */
export const JSON_SCHEMA_2020_12_INPUT = z
  .object({
    name: z.string().optional(),
    address: z
      .unknown()
      .pipe(z.object({ street: z.string().optional(), city: z.string().optional() }))
      .optional()
      .meta({ $ref: '#/$defs/address' }),
    contactMethod: z.enum(['phone', 'email']).optional(),
    phone: z.string().optional(),
    email: z.string().optional(),
  })
  .strict()
  // The rule the 2020-12 keywords below state, checked by zod as well: a phone number when
  // the contact method is the phone, else an email address.
  .refine((input) => (input.contactMethod === 'phone' ? input.phone !== undefined : input.email !== undefined), {
    message: 'phone is required when contactMethod is "phone", email otherwise',
  })
  .meta({
    $schema: JSON_SCHEMA_2020_12,
    $defs: {
      address: { $anchor: 'addressDef', type: 'object', properties: { street: { type: 'string' }, city: { type: 'string' } } },
    },
    // SEP-2106: composition and conditional keywords, which a server must pass on unchanged.
    allOf: [{ anyOf: [{ required: ['phone'] }, { required: ['email'] }] }],
    if: { properties: { contactMethod: { const: 'phone' } }, required: ['contactMethod'] },
    then: { required: ['phone'] },
    else: { required: ['email'] },
  })

/** The JSON Schema 2020-12 tool, whatever the SDK line that serves it. */
export const SCHEMA_TOOL = {
  name: 'json_schema_2020_12_tool',
  description: 'Tool with JSON Schema 2020-12 features ($schema, $defs with $anchor, additionalProperties, allOf/anyOf, if/then/else).',
  run: ({ name, address }: { name?: string; address?: unknown }) => text(`Received ${JSON.stringify({ name, address })}`),
}

function registerSchemaTool(server: McpServer): void {
  server.registerTool(SCHEMA_TOOL.name, { description: SCHEMA_TOOL.description, inputSchema: JSON_SCHEMA_2020_12_INPUT }, async (args) =>
    SCHEMA_TOOL.run(args),
  )
}

/** Static text and binary resources, a template, and a resource clients may subscribe to. */
function registerResources(server: McpServer): void {
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

  let watchedText = 'Initial content of the watched resource.'
  // Only the watched resource can be subscribed to: whether this session did.
  let subscribed = false
  server.registerResource(
    'watched-resource',
    WATCHED_URI,
    { description: 'A resource to subscribe to; update_watched_resource changes it.', mimeType: 'text/plain' },
    async (uri) => ({ contents: [{ uri: uri.href, mimeType: 'text/plain', text: watchedText }] }),
  )
  server.server.registerCapabilities({ resources: { subscribe: true } })
  server.server.setRequestHandler(SubscribeRequestSchema, (request) => {
    const { uri } = request.params
    if (uri !== WATCHED_URI) throw new McpError(ErrorCode.InvalidParams, `Resource ${uri} cannot be subscribed to`)
    subscribed = true
    return {}
  })
  server.server.setRequestHandler(UnsubscribeRequestSchema, (request) => {
    if (request.params.uri === WATCHED_URI) subscribed = false
    return {}
  })
  server.registerTool(
    'update_watched_resource',
    {
      description: `Replaces the text of ${WATCHED_URI}; a subscribed client is sent notifications/resources/updated.`,
      inputSchema: { text: z.string().max(10_000) },
    },
    async (args, extra) => {
      watchedText = args.text
      if (!subscribed) return text('Updated; no subscribers.')
      await extra.sendNotification({ method: 'notifications/resources/updated', params: { uri: WATCHED_URI } })
      return text('Updated; subscribers notified.')
    },
  )
}

/** Prompts: plain, with (completable) arguments, with an embedded resource, with an image. */
function registerPrompts(server: McpServer): void {
  server.registerPrompt(PROMPTS.simple.name, { description: PROMPTS.simple.description }, () => PROMPTS.simple.messages())
  server.registerPrompt(
    PROMPTS.withArguments.name,
    {
      description: PROMPTS.withArguments.description,
      argsSchema: {
        arg1: completable(z.string().max(10_000).describe('First test argument'), completeArg1),
        arg2: z.string().max(10_000).describe('Second test argument'),
      },
    },
    (args) => PROMPTS.withArguments.messages(args),
  )
  server.registerPrompt(
    PROMPTS.embeddedResource.name,
    {
      description: PROMPTS.embeddedResource.description,
      argsSchema: { resourceUri: z.string().max(2_048).describe('URI of the resource to embed') },
    },
    (args) => PROMPTS.embeddedResource.messages(args),
  )
  server.registerPrompt(PROMPTS.image.name, { description: PROMPTS.image.description }, () => PROMPTS.image.messages())
}
