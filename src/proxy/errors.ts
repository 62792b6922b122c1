// The JSON error shape, written in src/client/response.ts (every listener answers in it).
export { sendError, type ErrorBody } from '../client/response.js'
