// ws_echo.js -- the Node side of bench/run_ws.sh: a WebSocket echo server
// on the `ws` package (installed into bench/node/node_modules by the
// script), text echoed as text, binary as binary.
//   node bench/node/ws_echo.js PORT
const { WebSocketServer } = require('ws');
const port = Number(process.argv[2] || 9000);
const wss = new WebSocketServer({ host: '127.0.0.1', port, perMessageDeflate: false });
wss.on('connection', (ws) => {
  ws.on('message', (data, isBinary) => ws.send(data, { binary: isBinary }));
});
wss.on('listening', () => console.log(`ws_echo.js listening on 127.0.0.1:${port}`));
