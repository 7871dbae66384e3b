// A small MCP server written with the `fastmcp` package, the way its README
// shows, for trying the gateway in front of a server this project did not
// write. scripts/interop-outside.mjs copies it next to a scratch install of
// fastmcp and runs it on the npm-packaged Node 24 (fastmcp's dependencies ask
// for Node 22 or later). PORT picks the port; the endpoint is /mcp.
import { FastMCP } from 'fastmcp'
import { z } from 'zod'

const server = new FastMCP({ name: 'fastmcp-interop', version: '1.0.0' })

server.addTool({
  name: 'add',
  description: 'Adds two numbers',
  parameters: z.object({ a: z.number(), b: z.number() }),
  execute: async ({ a, b }) => String(a + b)
})

server.addTool({
  name: 'count',
  description: 'Reports progress and logs a line per step, then answers',
  parameters: z.object({ steps: z.number().int().min(1).max(100) }),
  execute: async ({ steps }, { reportProgress, log }) => {
    for (let i = 1; i <= steps; i++) {
      await new Promise((resolve) => setTimeout(resolve, 50))
      log.info(`step ${i}`)
      await reportProgress({ progress: i, total: steps })
    }
    return `counted ${steps}`
  }
})

server.addTool({
  name: 'ask-llm',
  description: 'Asks the client to sample an LLM',
  parameters: z.object({ prompt: z.string() }),
  // The context's `session` is the authentication payload; sampling is a
  // method of the FastMCPSession, found by the call's session id.
  execute: async ({ prompt }, { sessionId }) => {
    const session = server.sessions.find((s) => s.sessionId === sessionId)
    if (session === undefined) throw new Error(`no FastMCP session ${sessionId}`)
    const result = await session.requestSampling({ messages: [{ role: 'user', content: { type: 'text', text: prompt } }], maxTokens: 50 })
    return `LLM said: ${result.content.type === 'text' ? result.content.text : '(not text)'}`
  }
})

server.addTool({
  name: 'confirm',
  description: 'Asks the user to confirm',
  parameters: z.object({}),
  execute: async (_args, { elicit }) => {
    const response = await elicit({
      message: 'Proceed?',
      requestedSchema: { type: 'object', properties: { confirmed: { type: 'boolean' } }, required: ['confirmed'] }
    })
    return `action=${response.action} confirmed=${response.content?.confirmed}`
  }
})

await server.start({ transportType: 'httpStream', httpStream: { port: Number(process.env.PORT ?? 8080), host: '127.0.0.1' } })
