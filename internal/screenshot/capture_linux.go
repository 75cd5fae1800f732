package screenshot

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image"
	"image/png"
	"io"
	"log"
	"math/bits"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jezek/xgb"
	"github.com/jezek/xgb/xproto"

	"github.com/agentbox/agentbox/internal/errcode"
)

// x11Dir holds the X servers' local sockets (X0 for :0, …).
const x11Dir = "/tmp/.X11-unix"

func init() { xgb.Logger = log.New(io.Discard, "", 0) } // xgb logs to stderr by default

// localDisplays lists the X displays with a socket on this machine (":0", ":1", …), sorted.
func localDisplays() []string {
	ents, _ := os.ReadDir(x11Dir)
	var nums []int
	for _, e := range ents {
		if n, err := strconv.Atoi(strings.TrimPrefix(e.Name(), "X")); err == nil && strings.HasPrefix(e.Name(), "X") {
			nums = append(nums, n)
		}
	}
	slices.Sort(nums)
	out := make([]string, 0, min(len(nums), maxDisplays))
	for _, n := range nums[:min(len(nums), maxDisplays)] {
		out = append(out, ":"+strconv.Itoa(n))
	}
	return out
}

// capture takes the root window of X display :N (or $DISPLAY, or :0) and encodes it as PNG.
func capture(ctx context.Context, display *int) (*Shot, error) {
	name := os.Getenv("DISPLAY")
	switch {
	case display != nil:
		name = ":" + strconv.Itoa(*display)
	case name == "":
		name = ":0"
	}
	found := localDisplays()
	conn, err := dial(ctx, name)
	if err != nil {
		return nil, classify(name, found, err)
	}
	defer conn.Close()
	setup := xproto.Setup(conn)
	screenNum := 0
	if i := strings.LastIndexByte(name, '.'); i > strings.LastIndexByte(name, ':') { // ":1.1"
		screenNum, _ = strconv.Atoi(name[i+1:])
	}
	if len(setup.Roots) == 0 || screenNum >= len(setup.Roots) {
		return nil, noDisplay("the X server on %s has no screen %d", name, screenNum)
	}
	root := setup.Roots[screenNum]
	w, h := int(root.WidthInPixels), int(root.HeightInPixels)
	if err := checkSize(w, h); err != nil {
		return nil, err
	}
	taken := time.Now().UTC()
	type result struct {
		r   *xproto.GetImageReply
		err error
	}
	ch := make(chan result, 1)
	go func() {
		r, err := xproto.GetImage(conn, xproto.ImageFormatZPixmap, xproto.Drawable(root.Root), 0, 0, uint16(w), uint16(h), 0xffffffff).Reply()
		ch <- result{r, err}
	}()
	var reply *xproto.GetImageReply
	select {
	case res := <-ch:
		if res.err != nil {
			return nil, fmt.Errorf("X GetImage of %s: %v", name, res.err)
		}
		reply = res.r
	case <-ctx.Done():
		return nil, errcode.New(errcode.Internal, "the X server on %s did not send the image within %v", name, captureTimeout)
	}
	img, err := toRGBA(setup, root, reply, w, h)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	if err := (&png.Encoder{CompressionLevel: png.BestSpeed}).Encode(&buf, img); err != nil {
		return nil, err
	}
	if buf.Len() > MaxPNGBytes {
		return nil, errcode.New(errcode.UnsupportedOp, "the screenshot of %s is %d bytes as PNG; at most %d", name, buf.Len(), MaxPNGBytes)
	}
	return &Shot{PNG: buf.Bytes(), Display: name, Screen: screenNum, Screens: len(setup.Roots), Displays: found,
		Width: w, Height: h, TakenAt: taken}, nil
}

// dial connects to the X server of name, giving up when ctx ends (a server that accepts the
// socket but never answers the handshake cannot hold the request).
func dial(ctx context.Context, name string) (*xgb.Conn, error) {
	type result struct {
		c   *xgb.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		c, err := xgb.NewConnDisplay(name)
		ch <- result{c, err}
	}()
	select {
	case r := <-ch:
		return r.c, r.err
	case <-ctx.Done():
		go func() { // close it if it ever comes
			if r := <-ch; r.c != nil {
				r.c.Close()
			}
		}()
		return nil, errcode.New(errcode.Internal, "the X server on %s accepted the connection but did not complete the handshake", name)
	}
}

// classify turns a failed connection into the reply that says what is missing.
func classify(name string, found []string, err error) error {
	if _, typed := errcode.As(err); typed {
		return err
	}
	have := "none"
	if len(found) > 0 {
		have = strings.Join(found, ", ")
	}
	msg := err.Error()
	switch {
	case strings.Contains(msg, "authentication refused") || strings.Contains(msg, "unsupported auth") || errors.Is(err, syscall.EACCES):
		return noPermission("the X server on %s refused the machine agent's connection (%s): give the agent the display's cookie (XAUTHORITY) or allow its user (xhost +SI:localuser:USER)", name, msg)
	case errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) || strings.Contains(msg, "no such file") || strings.Contains(msg, "connection refused"):
		return noDisplay("no X server listens on %s (%s); X displays found on this machine: %s", name, msg, have)
	}
	return noDisplay("could not connect to the X server on %s: %s; X displays found on this machine: %s", name, msg, have)
}

// toRGBA converts a ZPixmap reply of the root window into an opaque RGBA image, using the
// server's pixmap format (bits per pixel, scanline padding, byte order) and the root visual's
// channel masks.
func toRGBA(setup *xproto.SetupInfo, root xproto.ScreenInfo, r *xproto.GetImageReply, w, h int) (*image.RGBA, error) {
	var bpp, pad int
	for _, f := range setup.PixmapFormats {
		if f.Depth == r.Depth {
			bpp, pad = int(f.BitsPerPixel), int(f.ScanlinePad)
		}
	}
	var vis *xproto.VisualInfo
	for _, d := range root.AllowedDepths {
		for i := range d.Visuals {
			if d.Visuals[i].VisualId == root.RootVisual {
				vis = &d.Visuals[i]
			}
		}
	}
	if vis == nil || (bpp != 16 && bpp != 24 && bpp != 32) || pad == 0 || vis.Class != xproto.VisualClassTrueColor && vis.Class != xproto.VisualClassDirectColor {
		return nil, errcode.New(errcode.UnsupportedOp, "the X server's root window is depth %d at %d bits per pixel without a TrueColor visual; only 16, 24 and 32 bits per pixel TrueColor are captured", r.Depth, bpp)
	}
	stride := (w*bpp + pad - 1) / pad * pad / 8
	if len(r.Data) < stride*h {
		return nil, fmt.Errorf("X GetImage sent %d bytes for %d rows of %d", len(r.Data), h, stride)
	}
	msb := setup.ImageByteOrder == xproto.ImageOrderMSBFirst
	chans := [3]uint32{vis.RedMask, vis.GreenMask, vis.BlueMask}
	var shift, width [3]int
	for i, m := range chans {
		shift[i], width[i] = bits.TrailingZeros32(m), bits.OnesCount32(m)
		if width[i] == 0 {
			return nil, errcode.New(errcode.UnsupportedOp, "the X server's visual has an empty colour mask")
		}
	}
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	bytesPP := bpp / 8
	for y := range h {
		row := r.Data[y*stride:]
		o := img.Pix[y*img.Stride:]
		for x := range w {
			px := row[x*bytesPP : x*bytesPP+bytesPP]
			var v uint32
			for i := range bytesPP {
				if msb {
					v = v<<8 | uint32(px[i])
				} else {
					v |= uint32(px[i]) << (8 * i)
				}
			}
			for c := range 3 {
				cv := (v & chans[c]) >> shift[c]
				o[4*x+c] = uint8(cv * 255 / (1<<width[c] - 1))
			}
			o[4*x+3] = 0xff
		}
	}
	return img, nil
}
