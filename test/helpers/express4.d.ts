/**
 * Express 4, installed as the dev dependency `express4` (`npm:express@^4`), beside Express 5.
 * Typed loosely, as Express 5 (`@types/express` is v5): the surface the tests use (`express()`,
 * `Router`, `json`, `text`, `request`, `app.use` / `get` / `post`) is the same on both.
 */
declare module 'express4' {
  import express from 'express'
  export default express
}
