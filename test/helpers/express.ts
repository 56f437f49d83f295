/**
 * The Express versions the Express adapter is tested on: the peer dependency takes
 * `^4.21.0 || ^5.0.0`. `express` is Express 5; `express4` is Express 4, installed as the dev
 * dependency `express4` (`npm:express@^4`).
 */
import express from 'express'
import express4 from 'express4'

/** An Express module (`express()`, `express.json()`, `express.Router()`…). */
export type ExpressModule = typeof express

export const EXPRESS = { express, express4 } as const satisfies Record<string, ExpressModule>

/** `express` (Express 5) or `express4`. */
export type ExpressKind = keyof typeof EXPRESS
export const EXPRESS_KINDS: readonly ExpressKind[] = ['express', 'express4']
